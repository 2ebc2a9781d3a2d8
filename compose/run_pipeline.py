"""Runs the example pipeline, integration/pipeline.py, in the compose Spark service.

`pipeline.main()` builds its session with integration/spark_support.py, which fetches the
Kafka connector with Maven into a local cache; in the Spark image the connector comes
from `spark-submit --packages` instead (docker-compose.yml). So this driver takes the
session spark-submit made and hands it to the pipeline, with the pipeline's own options:

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version> \\
        run_pipeline.py --bootstrap agent-1:9092 --checkpoint /var/lib/pipeline/checkpoint
"""

from __future__ import annotations

import os
import sys

# The repository's integration/ folder, mounted next to compose/ in the container.
INTEGRATION = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"
)


def main(argv: list[str]) -> int:
    sys.path.insert(0, INTEGRATION)
    import pipeline
    from pyspark.sql import SparkSession

    args = pipeline.parse_args(argv)
    spark = SparkSession.builder.appName("bucketlog-pipeline").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    query = pipeline.start(
        spark,
        bootstrap=args.bootstrap,
        input_topic=args.input,
        output_topic=args.output,
        checkpoint=args.checkpoint,
        window=args.window,
        watermark=args.watermark,
        output_mode=args.output_mode,
        starting_offsets=args.starting_offsets,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
    )
    print(f"pipeline: {args.input} -> {args.output} on {args.bootstrap}", file=sys.stderr)
    try:
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
