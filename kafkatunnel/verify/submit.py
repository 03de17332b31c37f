"""verify as a spark-submit application, for clusters where jobs go through spark-submit
(YARN, Kubernetes, standalone with cluster deploy mode):

    spark-submit --py-files kafkatunnel.zip \\
        "$(python -c 'import kafkatunnel.verify.submit as m; print(m.__file__)')" \\
        hdfs:///recordings/ --json report.json --html report.html

The master, resources and files come from spark-submit; the exit code is verify's.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from kafkatunnel.verify.job import verify_spark
    from kafkatunnel.verify.report import summary_lines, write_reports

    parser = argparse.ArgumentParser(prog="kafkatunnel-verify")
    parser.add_argument("paths", nargs="+", help="recordings: files, directories or URIs")
    parser.add_argument(
        "--json", dest="json_file", help="write the report as JSON here (-: standard output)"
    )
    parser.add_argument("--html", dest="html_file", help="write the HTML report here")
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("kafkatunnel verify").getOrCreate()
    try:
        report = verify_spark(args.paths, spark)
    finally:
        spark.stop()
    for line in summary_lines(report):
        print(line)
    write_reports(report, args.json_file, args.html_file)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
