"""The suite's own sessions run the version of a test file that is on disk. Its tests rewrite their
test files within a second, often to the same size (a golden created, then the kernel changed by a
digit); Python's and pytest's bytecode caches key on the file's whole-second mtime and its size, so
a cached copy would run the previous version: a test that should fail passed (see conftest.py)."""

import os

pytest_plugins = ["pytester"]


def _rewritten_alike(pytester, run) -> None:
    """The test file (pytest's cache of rewritten asserts) and a module it imports (Python's own),
    each changed by one digit with its mtime kept."""
    test = pytester.makepyfile(test_x="from kernel import VALUE\n\ndef test_x():\n    assert (1, VALUE) == (1, 1)\n")
    kernel = pytester.makepyfile(kernel="VALUE = 1\n")
    run().assert_outcomes(passed=1)
    for path, change in ((test, ("(1, VALUE)", "(2, VALUE)")), (kernel, ("= 1", "= 2"))):
        stat = path.stat()
        text = path.read_text()
        path.write_text(text.replace(*change))
        os.utime(path, (stat.st_mtime, stat.st_mtime))
        assert path.stat().st_size == stat.st_size and path.read_text() != text
        run().assert_outcomes(failed=1)
        path.write_text(text)  # back: the next file's change alone fails the next run
        os.utime(path, (stat.st_mtime, stat.st_mtime))


def test_a_test_file_rewritten_alike_runs_its_new_version_in_process(pytester):
    _rewritten_alike(pytester, lambda: pytester.runpytest_inprocess("-p", "no:cacheprovider"))


def test_a_test_file_rewritten_alike_runs_its_new_version_in_a_subprocess(pytester):
    _rewritten_alike(pytester, lambda: pytester.runpytest_subprocess("-p", "no:cacheprovider"))
