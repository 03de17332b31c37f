// The Apache Kafka Java client (kafka-clients, from the cached jars) as an application
// uses it, for the tests: compiled by them with javac.
//   java JavaClient produce BOOTSTRAP TOPIC COUNT
//   java JavaClient consume BOOTSTRAP TOPIC GROUP COUNT PROTOCOL   (classic or consumer)
//   java JavaClient share BOOTSTRAP TOPIC GROUP COUNT [SECONDS]    (a share group, KIP-932)
// Prints PRODUCED n, or CONSUMED n: the distinct values read (a record delivered twice counts
// once), after committing; it reads for 60 seconds at most (a share group: SECONDS) and
// commits within 30.
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class JavaClient {
    public static void main(String[] args) throws Exception {
        // env:NAME: the address from the environment variable NAME, as an application
        // configured only by its environment (Spring Boot's SPRING_KAFKA_*) reads it
        String mode = args[0], topic = args[2];
        String bootstrap = args[1].startsWith("env:") ? System.getenv(args[1].substring(4)) : args[1];
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        if (mode.equals("produce")) {
            int count = Integer.parseInt(args[3]);
            props.put("key.serializer", StringSerializer.class.getName());
            props.put("value.serializer", StringSerializer.class.getName());
            props.put("acks", "all");
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < count; i++) {
                    sent.add(producer.send(new ProducerRecord<>(topic, "java-" + i)));
                }
                int acked = 0;
                for (Future<RecordMetadata> each : sent) {
                    each.get();
                    acked++;
                }
                System.out.println("PRODUCED " + acked);
            }
        } else if (mode.equals("share")) {
            props.put("group.id", args[3]);
            props.put("key.deserializer", StringDeserializer.class.getName());
            props.put("value.deserializer", StringDeserializer.class.getName());
            int count = Integer.parseInt(args[4]);
            long seconds = args.length > 5 ? Long.parseLong(args[5]) : 60;
            Set<String> values = new HashSet<>();
            try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
                consumer.subscribe(List.of(topic));
                long deadline = System.currentTimeMillis() + seconds * 1000;
                while (values.size() < count && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                        values.add(record.value());
                    }
                }
                consumer.commitSync(Duration.ofSeconds(30)); // acknowledges what was delivered
            }
            System.out.println("CONSUMED " + values.size());
        } else {
            String group = args[3];
            int count = Integer.parseInt(args[4]);
            props.put("group.id", group);
            props.put("group.protocol", args[5]);
            props.put("auto.offset.reset", "earliest");
            props.put("enable.auto.commit", "false");
            props.put("key.deserializer", StringDeserializer.class.getName());
            props.put("value.deserializer", StringDeserializer.class.getName());
            Set<String> values = new HashSet<>();
            try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
                consumer.subscribe(List.of(topic));
                long deadline = System.currentTimeMillis() + 60_000;
                while (values.size() < count && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                        values.add(record.value());
                    }
                }
                consumer.commitSync(Duration.ofSeconds(30));
            }
            System.out.println("CONSUMED " + values.size());
        }
    }
}
