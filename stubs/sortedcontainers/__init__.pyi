# Type declarations for the parts of sortedcontainers that kafkakv calls.
from collections.abc import Iterator
from typing import TypeVar

_KT = TypeVar("_KT")
_VT = TypeVar("_VT")

# A dict subclass: get, in, len, [] and pop are dict's; iteration is in key order.
class SortedDict(dict[_KT, _VT]):
    def __init__(self) -> None: ...
    def irange(
        self,
        minimum: _KT | None = ...,
        maximum: _KT | None = ...,
        inclusive: tuple[bool, bool] = ...,
        reverse: bool = ...,
    ) -> Iterator[_KT]: ...
