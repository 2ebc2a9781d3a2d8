// A Kafka Streams application that counts the records of each key of a topic: a KTable
// (groupByKey().count()) in a persistent RocksDB store, logged to the compacted changelog
// topic Streams creates, its updates written to an output topic as key -> count (a long).
//
// Runs from source with the jars of `integration/fetch-jars.sh streams`, nothing to build:
//
//   java -cp 'integration/.cache/jars/streams/*' integration/java/CountsApp.java \
//       <bootstrap> <application.id> <input topic> <output topic> <state dir> \
//       [<changelog topic config>=<value> ...]
//
// Streams creates the changelog with the configs given, besides its own
// (cleanup.policy=compact). The application stops, leaving its consumer group, when its
// standard input closes. It prints one line per event on stdout, for the caller to read:
//   state <old> <new>                                       a state change of the client
//   restore-start <topic> <partition> <store> <from> <to>   a store starts restoring
//   restore-end <topic> <partition> <store> <records>       ... and has read that many
//   error <what>                                            it failed (exit status 1)
//   closed                                                  it closed (exit status 0)

import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

public class CountsApp {
    static final String STORE = "counts";

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: CountsApp <bootstrap> <application.id> <input> <output>"
                + " <state dir> [<changelog config>=<value> ...]");
            System.exit(2);
        }
        Map<String, String> changelogConfigs = new HashMap<>();
        for (int i = 5; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            changelogConfigs.put(pair[0], pair[1]);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        // No record cache: every input record is one update of the store, so one record
        // in the changelog and one in the output topic.
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey()
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE)
                .withLoggingEnabled(changelogConfigs))
            .toStream()
            .to(args[3], Produced.with(Serdes.String(), Serdes.Long()));

        CountDownLatch stop = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean(false);
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setStateListener((now, before) -> {
            say("state " + before + " " + now);
            if (now == KafkaStreams.State.ERROR) {
                failed.set(true);
                stop.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            say("error " + e);
            failed.set(true);
            stop.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long from, long to) {
                say("restore-start " + tp.topic() + " " + tp.partition() + " " + store
                    + " " + from + " " + to);
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long end, long n) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                say("restore-end " + tp.topic() + " " + tp.partition() + " " + store
                    + " " + total);
            }
        });

        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() != -1) {}
            } catch (java.io.IOException e) {
                // A closed or broken stdin means stop, as EOF does.
            }
            stop.countDown();
        }, "stdin-watch");
        stdin.setDaemon(true);
        stdin.start();

        streams.start();
        stop.await();
        // Leave the group, so that a restarted instance is given the tasks at once rather
        // than after the old member's session timeout.
        boolean closed = streams.close(CloseOptions
            .groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
            .withTimeout(Duration.ofSeconds(20)));
        if (failed.get() || !closed) {
            say("error " + (closed ? "stopped on a failure" : "close timed out"));
            System.exit(1);
        }
        say("closed");
        System.exit(0);
    }
}
