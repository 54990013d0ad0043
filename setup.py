"""The one part of the build that pyproject.toml cannot declare stably: the C extension.

``kafkakv.map._reads`` is the local read path of a replica map in C (see
``src/kafkakv/map/reads.py``). It is optional: where no C compiler is, the install goes on and
kafkakv reads through the same code in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("kafkakv.map._reads", ["src/kafkakv/map/_reads.c"], optional=True),
    ]
)
