"""`python -m vlmserve` is the same as the `vlmserve` console script."""

from vlmserve.cli.app import main

main()
