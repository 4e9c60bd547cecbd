"""`python -m servelab` is the same as the `servelab` console script."""

from servelab.cli.main import main

if __name__ == "__main__":
    main()
