"""What the portal's browser tests share."""

import os
from pathlib import Path

import pytest


@pytest.fixture
def shots(tmp_path):
    """Where a browser test saves a screenshot of each page: CC_PORTAL_SCREENSHOTS, else the
    test's temporary folder."""
    folder = Path(os.environ.get("CC_PORTAL_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
