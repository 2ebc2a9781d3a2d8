// One Java producer at a fixed rate into partition 0 of a topic, for the lightning
// benchmark (integration/bench/lightning.py): the Java client pipelines an idempotent
// producer's requests (up to max.in.flight.requests.per.connection=5 per partition),
// which librdkafka does not.
//
// Runs from source with the jars of `integration/fetch-jars.sh kafka`, nothing to build:
//
//   java -cp 'integration/.cache/jars/kafka/*' integration/java/FixedRateProducer.java \
//       <bootstrap> <topic> <records/s> <warm-up s> <seconds> <record size> \
//       [<producer config>=<value> ...]
//
// Each record's first 8 bytes are the wall-clock time it was sent, in nanoseconds since
// the epoch, big-endian (what the benchmark's tailing consumer reads). Prints on stdout:
//   measuring            the warm-up is over: the records from here on are measured
//   ack <micros>         a measured record's acknowledgement, after its send
//   error <what>         a record's send failed
//   done <sent> <seconds of the measured part>

import java.nio.ByteBuffer;
import java.time.Instant;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class FixedRateProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int rate = Integer.parseInt(args[2]);
        double warmupS = Double.parseDouble(args[3]);
        double seconds = Double.parseDouble(args[4]);
        int size = Integer.parseInt(args[5]);
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        for (int i = 6; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        int warmupN = (int) (rate * warmupS);
        int total = warmupN + (int) (rate * seconds);
        StringBuilder out = new StringBuilder();
        Object lock = new Object();
        long measuredFrom = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            long start = System.nanoTime();
            for (int i = 0; i < total; i++) {
                if (i == warmupN) {
                    System.out.println("measuring");
                    System.out.flush();
                    measuredFrom = System.nanoTime();
                }
                long due = start + (long) (i * 1e9 / rate);
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                }
                Instant now = Instant.now();
                byte[] value = new byte[size];
                ByteBuffer.wrap(value).putLong(now.getEpochSecond() * 1_000_000_000L + now.getNano());
                boolean measured = i >= warmupN;
                long sentAt = System.nanoTime();
                producer.send(new ProducerRecord<>(topic, 0, null, value), (metadata, exception) -> {
                    long micros = (System.nanoTime() - sentAt) / 1000;
                    synchronized (lock) {
                        if (exception != null) {
                            out.append("error ").append(exception.toString().replace('\n', ' ')).append('\n');
                        } else if (measured) {
                            out.append("ack ").append(micros).append('\n');
                        }
                    }
                });
            }
            double measuredS = (System.nanoTime() - measuredFrom) / 1e9;
            producer.flush();
            synchronized (lock) {
                System.out.print(out);
            }
            System.out.println("done " + (total - warmupN) + " " + measuredS);
        }
    }
}
