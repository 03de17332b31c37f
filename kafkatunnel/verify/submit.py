"""verify as a spark-submit application, for clusters where jobs go through spark-submit
(YARN, Kubernetes, standalone with cluster deploy mode):

    spark-submit --py-files kafkatunnel.zip \\
        "$(python -c 'import kafkatunnel.verify.submit as m; print(m.__file__)')" \\
        hdfs:///recordings/ --json report.json --html report.html --junit verify.xml

The master, resources and files come from spark-submit; the exit code is verify's.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from kafkatunnel.verify.identity import parse_broker_entries
    from kafkatunnel.verify.job import verify_spark
    from kafkatunnel.verify.report import (
        final_line,
        summary_lines,
        verdict_of_run,
        write_reports,
    )

    parser = argparse.ArgumentParser(prog="kafkatunnel-verify")
    parser.add_argument("paths", nargs="+", help="recordings: files, directories or URIs")
    parser.add_argument(
        "--json",
        dest="json_file",
        help="write the report as JSON here (-: standard output, and nothing else there)",
    )
    parser.add_argument("--html", dest="html_file", help="write the HTML report here")
    parser.add_argument("--junit", dest="junit_file", help="write a JUnit XML report here")
    parser.add_argument(
        "--broker", action="append", default=[], metavar="ADDRESS=NODE",
        help="the broker behind a captured server address (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--strict", action="store_true",
        help="also fail when a group is unverified, nothing was checked, or a file is cut short",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        brokers = parse_broker_entries(args.broker)
    except ValueError as cause:
        parser.error(f"--broker: {cause}")
    spark = SparkSession.builder.appName("kafkatunnel verify").getOrCreate()
    try:
        report = verify_spark(args.paths, spark, brokers)
    finally:
        spark.stop()
    problems, failed = verdict_of_run(report, args.strict)
    lines = summary_lines(report) + problems
    # spark-submit merges the application's stderr into its stdout (PythonRunner), so JSON
    # on stdout must come alone: what the lines say is in it too ("nothing_checked", ...).
    if args.json_file != "-":
        print("\n".join([*lines, final_line(report, failed)]))
    write_reports(report, args.json_file, args.html_file, args.junit_file, args.strict)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
