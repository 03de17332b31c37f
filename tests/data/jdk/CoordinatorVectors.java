// Derives coordinator-partition vectors with the JDK's own String.hashCode.
// Input lines: a key as hex UTF-16 code units (so lone surrogates survive), e.g. "00670031".
// Output lines: hex, hashCode, partitionFor(key, 50), partitionFor(key, 7).
// Utils.abs is copied from Kafka (clients/src/main/java/org/apache/kafka/common/utils/Utils.java).
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class CoordinatorVectors {
    static int kafkaAbs(int n) {
        return (n == Integer.MIN_VALUE) ? 0 : Math.abs(n);
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        String line;
        while ((line = in.readLine()) != null) {
            StringBuilder key = new StringBuilder();
            for (int i = 0; i + 4 <= line.length(); i += 4) {
                key.append((char) Integer.parseInt(line.substring(i, i + 4), 16));
            }
            int hash = key.toString().hashCode();
            System.out.println(line + "\t" + hash + "\t" + kafkaAbs(hash) % 50 + "\t" + kafkaAbs(hash) % 7);
        }
    }
}
