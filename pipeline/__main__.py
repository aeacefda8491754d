"""The `pipeline` command and `python -m pipeline`: the CLI with Python's collector paused for the
start-up (startup.py). Tests and notebooks call `pipeline.cli.main` and keep their collector as it is."""

from pipeline import startup


def main() -> None:
    startup.pause()
    from pipeline.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
