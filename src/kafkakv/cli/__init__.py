"""The ``kafkakv`` command line: a thin shell over the public API."""
