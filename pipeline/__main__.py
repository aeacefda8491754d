"""The `pipeline` command and `python -m pipeline`."""

from pipeline.cli import main

if __name__ == "__main__":
    main(prog_name="pipeline")  # the help and errors name the command users type
