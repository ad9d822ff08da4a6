// A Curator InterProcessMutex client for lock-zk's interop tests (tests/interop.rs), compiled
// at test time against Debian's Curator jars. Its lines on stdout, times in microseconds of the
// system clock (the same clock the test reads):
//
//   CuratorPeer <connect string> <lock path> hold|hold-read|hold-write
//       (hold-read and hold-write: InterProcessReadWriteLock's read and write locks)
//       HELD <t>      once acquire() returned (t taken inside the critical section)
//       (waits for a line on stdin)
//       RELEASED <t>  t taken before release() was called
//   CuratorPeer <connect string> <lock path> loop <milliseconds>
//       WINDOW <start> <end>   per acquisition, until the time is up
//       DONE <count>
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Instant;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;

public class CuratorPeer {
    static long nowMicros() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1_000;
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10_000, 10_000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        InterProcessMutex mutex;
        if (args[2].equals("hold-read")) {
            mutex = new InterProcessReadWriteLock(client, args[1]).readLock();
        } else if (args[2].equals("hold-write")) {
            mutex = new InterProcessReadWriteLock(client, args[1]).writeLock();
        } else {
            mutex = new InterProcessMutex(client, args[1]);
        }
        if (args[2].startsWith("hold")) {
            mutex.acquire();
            System.out.println("HELD " + nowMicros());
            System.out.flush();
            new BufferedReader(new InputStreamReader(System.in)).readLine();
            System.out.println("RELEASED " + nowMicros());
            System.out.flush();
            mutex.release();
        } else {
            long end = System.nanoTime() + Long.parseLong(args[3]) * 1_000_000L;
            int count = 0;
            while (System.nanoTime() < end) {
                mutex.acquire();
                long start = nowMicros();
                Thread.sleep(2);
                long stop = nowMicros();
                mutex.release();
                System.out.println("WINDOW " + start + " " + stop);
                count++;
            }
            System.out.println("DONE " + count);
            System.out.flush();
        }
        client.close();
    }
}
