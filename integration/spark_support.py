"""A local SparkSession wired for bucketlog: Spark's Kafka connector, bound to 127.0.0.1.

The connector's jars are not in the pyspark wheel; integration/fetch-jars.sh fetches them
with Maven into integration/.cache/jars/spark (run here when that folder is empty) and
they reach Spark through `spark.jars`. One session per process: starting one takes
several seconds, so tests share a single session.

    from spark_support import spark_session, kafka_options
    spark = spark_session("my-job")
    df = spark.read.format("kafka").options(**kafka_options("127.0.0.1:9092")).option(
        "subscribe", "events").load()
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INTEGRATION = Path(__file__).resolve().parent
CONNECTOR_JARS = INTEGRATION / ".cache" / "jars" / "spark"
LOG4J2_CONFIG = INTEGRATION / "spark-log4j2.properties"
LOCAL_IP = "127.0.0.1"


def connector_jars(*, fetch: bool = True) -> list[Path]:
    """The connector's jars (spark-sql-kafka, token provider, kafka-clients, commons-pool2)."""
    jars = sorted(CONNECTOR_JARS.glob("*.jar"))
    if not jars and fetch:
        subprocess.run([str(INTEGRATION / "fetch-jars.sh"), "spark"], check=True)
        jars = sorted(CONNECTOR_JARS.glob("*.jar"))
    if not jars:
        raise FileNotFoundError(f"no jars in {CONNECTOR_JARS}: run integration/fetch-jars.sh")
    return jars


def spark_session(
    app_name: str = "bucketlog",
    *,
    master: str = "local[2]",
    java_options: str = "",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create this process's SparkSession, with the Kafka connector on its classpath.

    Everything listens on 127.0.0.1 only; the UI is off, shuffles use 2 partitions (a
    local job has few rows) and times are UTC, so the same query prints the same rows
    on every machine. `java_options` go to the driver's JVM (the executors of a local
    master run in it too); `conf` adds or overrides Spark settings.
    """
    from pyspark.sql import SparkSession

    # Read by Spark's launcher scripts and by the JVM, before any configuration applies.
    os.environ.setdefault("SPARK_LOCAL_IP", LOCAL_IP)
    settings = {
        "spark.jars": ",".join(str(jar) for jar in connector_jars()),
        "spark.driver.host": LOCAL_IP,
        "spark.driver.bindAddress": LOCAL_IP,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG} "
        + java_options,
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **(conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop `spark`, and with it the driver's JVM and py4j's threads, while the interpreter
    still runs: left to the interpreter's exit, py4j's finalizer thread (a daemon) wakes
    while it shuts down, and the JVM ends only on reading its stdin's end after Python has
    gone. A session started after this launches a JVM of its own. Under spark-submit the
    JVM is this process's parent, not its child, and is left to it."""
    from py4j.clientserver import FinalizerWorker
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None or gateway.proc is None:  # no gateway, or spark-submit's
        return
    gateway.shutdown()  # the finalizer thread's cue too: it looks once a second
    gateway.proc.stdin.close()  # the gateway's JVM exits on its stdin's end
    gateway.proc.wait(60)
    SparkContext._gateway = SparkContext._jvm = None
    for thread in threading.enumerate():
        if isinstance(thread, FinalizerWorker):
            thread.join(10)


def kafka_options(bootstrap: str, **options: str) -> dict[str, str]:
    """Options of Spark's Kafka source or sink for a bucketlog at `bootstrap`."""
    return {"kafka.bootstrap.servers": bootstrap, **options}
