"""``mldserver demo``'s own parts; the demo end to end (embedded Spark) is in test_cli_jobs.py."""

from __future__ import annotations

from mldserver.ops.demo import cause


def test_a_spark_error_is_one_line_its_first_and_the_java_exception_at_its_root():
    error = ("SparkError: Py4JJavaError: An error occurred while calling o62.save.\n"
             ": org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o/_staging\n"
             "\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs(RawLocalFileSystem.java:873)\n")
    assert cause(error) == ("SparkError: Py4JJavaError: An error occurred while calling o62.save. <- "
                            "org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: "
                            "file:/o/_staging")
    deeper = error + "Caused by: java.lang.UnsupportedClassVersionError: Foo has been compiled by a more recent " \
                     "version\n\tat java.base/java.lang.ClassLoader.defineClass1(Native Method)\n\t... 12 more\n"
    assert cause(deeper).endswith(" <- java.lang.UnsupportedClassVersionError: Foo has been compiled by a more "
                                  "recent version")
    assert cause("OSError: [Errno 28] No space left on device") == "OSError: [Errno 28] No space left on device"
    assert cause("") == "(no message)"
    assert len(cause("ValueError: " + "x" * 1000)) == 400
