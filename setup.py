"""The one part of the build that pyproject.toml cannot declare stably: the C extensions.

- ``kafkakv.map._reads``: the local read path of a replica map (see
  ``src/kafkakv/map/reads.py``);
- ``kafkakv.map._bulk``: the ops records of a Spark write task's rows, as records or as
  columns (see ``src/kafkakv/map/bulk.py``); it places rows as ``_murmur2`` does, with
  ``_murmur2.h``;
- ``kafkakv.log.embedded._frame``: the embedded log's append-side encoding (see
  ``src/kafkakv/log/embedded/frame.py``), linked with zlib for its CRC-32;
- ``kafkakv.log.embedded._columns``: the last value per key of stored batches as Arrow-shaped
  columns, and a list of values as one column (see ``src/kafkakv/log/embedded/columns.py``);
  it reads the rows as ``_frame`` does, with ``_rows.h``;
- ``kafkakv.log._murmur2``: the partition of a key (see ``src/kafkakv/log/partitioner.py``);
- ``kafkakv._gcpause``: the collector's pause around batch work (see ``src/kafkakv/gcpause.py``).

All are optional: where no C compiler (or no zlib header) is, the install goes on and kafkakv
runs the same code in Python.
"""

from setuptools import Extension, setup

ROWS = "src/kafkakv/log/embedded/_rows.h"  # the batch rows' msgpack readers, shared
MSGPACK = "src/kafkakv/_msgpack.h"  # msgpack writers, shared by _frame and _bulk
MURMUR2 = "src/kafkakv/_murmur2.h"  # Kafka's murmur2, shared by _murmur2 and _bulk

setup(
    ext_modules=[
        Extension("kafkakv.map._reads", ["src/kafkakv/map/_reads.c"], optional=True),
        Extension(
            "kafkakv.map._bulk",
            ["src/kafkakv/map/_bulk.c"],
            depends=[MSGPACK, MURMUR2],
            include_dirs=["src/kafkakv"],
            optional=True,
        ),
        Extension(
            "kafkakv.log.embedded._frame",
            ["src/kafkakv/log/embedded/_frame.c"],
            depends=[ROWS, MSGPACK],
            include_dirs=["src/kafkakv"],
            libraries=["z"],
            optional=True,
        ),
        Extension(
            "kafkakv.log.embedded._columns",
            ["src/kafkakv/log/embedded/_columns.c"],
            depends=[ROWS],
            optional=True,
        ),
        Extension(
            "kafkakv.log._murmur2",
            ["src/kafkakv/log/_murmur2.c"],
            depends=[MURMUR2],
            include_dirs=["src/kafkakv"],
            optional=True,
        ),
        Extension("kafkakv._gcpause", ["src/kafkakv/_gcpause.c"], optional=True),
    ]
)
