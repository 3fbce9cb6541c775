// A Curator InterProcessMutex, LeaderLatch, InterProcessSemaphoreV2 and
// InterProcessReadWriteLock on one path, driven line by line over stdin (see curator.rs).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayDeque;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorHolder {
    /** The mutex with the path of the node it holds. */
    static class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework client, String path) {
            super(client, path);
        }

        String heldNode() {
            return getLockPath();
        }
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[0]).sessionTimeoutMs(10000).connectionTimeoutMs(5000)
            .retryPolicy(new RetryNTimes(3, 200)).build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("FAILED connect");
            return;
        }
        Mutex mutex = new Mutex(client, args[1]);
        // Leadership changes are printed from a thread of their own: the listener runs on
        // Curator's event thread, where a blocking read would never be answered.
        ExecutorService printer = Executors.newSingleThreadExecutor();
        LeaderLatch latch = null;
        InterProcessSemaphoreV2 semaphore = null;
        ArrayDeque<Lease> leases = new ArrayDeque<>();
        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, args[1]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("READY");
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            if (cmd[0].equals("acquire") || cmd[0].equals("hold")) {
                if (!mutex.acquire(60, TimeUnit.SECONDS)) {
                    System.out.println("FAILED acquire");
                    continue;
                }
                // The node's czxid: the fencing token a zk:// holder of this node gets.
                long czxid = client.checkExists().forPath(mutex.heldNode()).getCzxid();
                System.out.println("ACQUIRED " + czxid);
                if (cmd[0].equals("hold")) {
                    Thread.sleep(Long.parseLong(cmd[1]));
                    mutex.release();
                    System.out.println("RELEASED");
                }
            } else if (cmd[0].equals("release")) {
                mutex.release();
                System.out.println("RELEASED");
            } else if (cmd[0].equals("latch")) {
                final LeaderLatch started = new LeaderLatch(client, args[1], cmd.length > 1 ? cmd[1] : "");
                started.addListener(new LeaderLatchListener() {
                    public void isLeader() {
                        try {
                            // The czxid of its node: the term a zk:// reader sees for it.
                            long czxid = client.checkExists().forPath(started.getOurPath()).getCzxid();
                            System.out.println("LEADER " + czxid);
                        } catch (Exception e) {
                            System.out.println("LEADER ?");
                        }
                    }

                    public void notLeader() {
                        System.out.println("NOTLEADER");
                    }
                }, printer);
                started.start();
                latch = started;
                System.out.println("STARTED");
            } else if (cmd[0].equals("leader")) {
                // Curator's view: the id (UTF-8 data) of the first node, "" if none.
                System.out.println("LEADERID " + latch.getLeader().getId());
            } else if (cmd[0].equals("has")) {
                System.out.println("HAS " + latch.hasLeadership());
            } else if (cmd[0].equals("close")) {
                // LeaderLatch.close() deletes its node in the background: wait (at most
                // 10 s) until the node is gone, so CLOSED means the latch left the queue.
                String node = latch.getOurPath();
                latch.close();
                latch = null;
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                while (node != null && client.checkExists().forPath(node) != null
                        && System.nanoTime() < deadline) {
                    Thread.sleep(5);
                }
                System.out.println("CLOSED");
            } else if (cmd[0].equals("semaphore")) {
                // One more lease of the semaphore of cmd[1] permits, waiting at most 60 s.
                if (semaphore == null) {
                    semaphore = new InterProcessSemaphoreV2(client, args[1], Integer.parseInt(cmd[1]));
                }
                Lease lease = semaphore.acquire(60, TimeUnit.SECONDS);
                if (lease == null) {
                    System.out.println("FAILED semaphore");
                    continue;
                }
                leases.addLast(lease);
                System.out.println("LEASED " + lease.getNodeName());
            } else if (cmd[0].equals("return")) {
                // Returns the oldest lease held.
                leases.removeFirst().close();
                System.out.println("RETURNED");
            } else if (cmd[0].equals("read") || cmd[0].equals("write")) {
                InterProcessMutex side = cmd[0].equals("read") ? rw.readLock() : rw.writeLock();
                if (!side.acquire(60, TimeUnit.SECONDS)) {
                    System.out.println("FAILED " + cmd[0]);
                    continue;
                }
                System.out.println(cmd[0].equals("read") ? "READING" : "WRITING");
            } else if (cmd[0].equals("unread") || cmd[0].equals("unwrite")) {
                InterProcessMutex side = cmd[0].equals("unread") ? rw.readLock() : rw.writeLock();
                side.release();
                System.out.println("UNLOCKED");
            } else if (cmd[0].equals("exit")) {
                break;
            }
        }
        printer.shutdownNow();
        client.close();
    }
}
