"""Where the repository and the test data are, for tests at any depth of the tier directories."""

from pathlib import Path

TESTS_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_ROOT.parent
