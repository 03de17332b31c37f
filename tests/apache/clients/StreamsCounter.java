// A Kafka Streams application as a Java team runs one on a laptop against the cluster, for
// the tests (tests/apache/test_streams.py, compiled there with javac against kafka-streams
// from Maven Central). It proves through the tunnel what Streams needs beyond a consumer:
// a repartition (orders re-keyed by their customer: a topic of its own, written and read
// back), a state store with a changelog (the count per customer), exactly-once processing
// (each commit one transaction over the output, the changelog, the repartition topic and the
// input offsets), and its group's rebalances, with the classic protocol or KIP-1071's.
//   java StreamsCounter BOOTSTRAP APPLICATION_ID INPUT OUTPUT PROTOCOL STATE_DIR
// INPUT holds orders, values "ORDER,CUSTOMER"; OUTPUT gets CUSTOMER -> count (a long).
// PROTOCOL is group.protocol: classic or streams. Prints a line whenever the instance's
// state or its active tasks change:
//   STATE RUNNING TASKS 0_0,0_1,1_2
// FAILED and the error if Streams stops on one; CLOSED after a clean close on SIGTERM.
import java.time.Duration;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

public class StreamsCounter {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], applicationId = args[1], input = args[2], output = args[3];
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, args[4]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 3); // its internal topics
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // A lost instance is noticed by the classic group's coordinator after its session
        // timeout (45 s by default): the broker's least, so the tests do not wait it out.
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 1500);

        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(input)
            .groupBy((order, value) -> value.split(",")[1], Grouped.as("by-customer"))
            .count(Materialized.as("orders-per-customer"))
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setUncaughtExceptionHandler(error -> {
            System.out.println("FAILED " + error);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            System.out.println("CLOSED");
            closed.countDown();
        }));
        streams.start();
        String said = "";
        while (closed.getCount() > 0) {
            String now = "STATE " + streams.state() + " TASKS " + activeTasks(streams);
            if (!now.equals(said)) {
                System.out.println(now);
                said = now;
            }
            closed.await(100, java.util.concurrent.TimeUnit.MILLISECONDS);
        }
    }

    /** The ids of the tasks this instance runs, sorted, comma-separated. */
    static String activeTasks(KafkaStreams streams) {
        TreeSet<String> tasks = new TreeSet<>();
        for (ThreadMetadata thread : streams.metadataForLocalThreads()) {
            for (TaskMetadata task : thread.activeTasks()) {
                tasks.add(task.taskId().toString());
            }
        }
        return String.join(",", tasks);
    }
}
