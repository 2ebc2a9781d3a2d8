#!/bin/sh
# Fetches the JVM jars of integration/pom.xml from Maven Central into
# integration/.cache/jars/<profile>/ (git-ignored):
#
#   spark    Spark's Kafka connector for the installed pyspark, minus what pyspark ships
#   kafka    Apache Kafka's command-line tools and broker (integration/bin/kafka-*)
#   streams  Kafka Streams, for the Java programs of integration/java/
#
# Usage: integration/fetch-jars.sh [spark] [kafka] [streams]     (no argument: all three)
# Environment: MVN (default mvn), PYTHON (default .venv/bin/python, to find pyspark).
# Each profile is copied into a fresh folder and moved into place when complete, so an
# interrupted fetch never leaves a half-filled cache behind.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cache="$here/.cache/jars"
MVN=${MVN:-mvn}
PYTHON=${PYTHON:-$root/.venv/bin/python}
profiles=${*:-spark kafka streams}

command -v "$MVN" >/dev/null 2>&1 || {
    echo "fetch-jars: '$MVN' not found; install Maven (Debian/Ubuntu: apt-get install maven)" >&2
    exit 1
}

pom_property() {
    sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$here/pom.xml" | head -n 1
}

# The jar's name without "-<version>.jar", to compare jar sets of different versions.
artifact_names() {
    ls "$1" | sed -n 's/-[0-9][^/]*\.jar$//p' | sort -u
}

pyspark_jars=
if [ -x "$PYTHON" ]; then
    pyspark_jars=$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null || true)
fi

mkdir -p "$cache"
for profile in $profiles; do
    case $profile in spark | kafka | streams) ;; *)
        echo "fetch-jars: unknown profile '$profile' (spark, kafka, streams)" >&2
        exit 2
        ;;
    esac
    if [ "$profile" = spark ] && [ -n "$pyspark_jars" ]; then
        installed=$("$PYTHON" -c 'import pyspark; print(pyspark.__version__)')
        wanted=$(pom_property spark.version)
        if [ "$installed" != "$wanted" ]; then
            echo "fetch-jars: pyspark $installed is installed but integration/pom.xml fetches the connector for Spark $wanted" >&2
            exit 1
        fi
    fi
    started=$(date +%s)
    tmp="$cache/$profile.partial"
    rm -rf "$tmp"
    log="$cache/$profile.log"
    if ! "$MVN" -B -Dstyle.color=never -f "$here/pom.xml" -P "$profile" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
        >"$log" 2>&1; then
        cat "$log" >&2
        echo "fetch-jars: $profile: Maven failed (log above, also in $log)" >&2
        exit 1
    fi
    if [ "$profile" = spark ] && [ -n "$pyspark_jars" ]; then
        overlap=$( (artifact_names "$tmp"; artifact_names "$pyspark_jars") | sort | uniq -d)
        if [ -n "$overlap" ]; then
            echo "fetch-jars: pyspark already ships these; exclude them in integration/pom.xml:" >&2
            echo "$overlap" >&2
            exit 1
        fi
    fi
    rm -rf "${cache:?}/$profile"
    mv "$tmp" "$cache/$profile"
    echo "fetch-jars: $profile: $(ls "$cache/$profile" | wc -l) jars in $(($(date +%s) - started)) s -> integration/.cache/jars/$profile"
done
