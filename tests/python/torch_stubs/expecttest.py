"""Stand-in for the PyPI package `expecttest`, which Debian's python3-torch imports in
torch.testing._internal.common_utils but does not ship.  The distributed suite never
records expected output, so a plain TestCase and ACCEPT = False are all it needs."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
