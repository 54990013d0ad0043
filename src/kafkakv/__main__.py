"""``python -m kafkakv``: the same command line as the ``kafkakv`` script."""

from kafkakv.cli.main import main

if __name__ == "__main__":
    main(prog_name="kafkakv")
