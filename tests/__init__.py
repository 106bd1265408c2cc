"""The vlmdata test suite: one folder per vlmdata package (tests/<package>/test_<module>.py); shared helpers in
tests/helpers, shared fixtures in tests/conftest.py."""
