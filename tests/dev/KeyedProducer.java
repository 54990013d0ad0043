// Produces COUNT records with the String keys "key-0" .. "key-<COUNT-1>" (value = key) to TOPIC
// with kafka-clients' KafkaProducer and its default partitioner, then prints one line
// "<key> <partition>" per record as the broker acknowledged it.
//
// Run as a single-file program: java -cp '<kafka libs>/*' KeyedProducer.java BOOTSTRAP TOPIC COUNT
// (used by test_partitioner.py to check kafkakv.log.partitioner against the Java client).

import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class KeyedProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);

        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ProducerConfig.ACKS_CONFIG, "all");
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        // no partitioner.class: the default, which hashes a record's key with murmur2

        try (KafkaProducer<String, String> producer = new KafkaProducer<>(config)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                String key = "key-" + i;
                sent.add(producer.send(new ProducerRecord<>(topic, key, key)));
            }
            producer.flush();
            for (int i = 0; i < count; i++) {
                System.out.println("key-" + i + " " + sent.get(i).get().partition());
            }
        }
    }
}
