// A go-zookeeper Lock client for lock-zk's interop tests (tests/interop.rs), built at test time
// against Debian's golang-github-samuel-go-zookeeper-dev (GOPATH mode). Its lines on stdout,
// times in microseconds of the system clock (the same clock the test reads):
//
//	gozk <hosts> <lock path> hold
//	    HELD <t>      once Lock() returned (t taken inside the critical section)
//	    (waits for a line on stdin)
//	    RELEASED <t>  t taken before Unlock() was called
//	gozk <hosts> <lock path> loop <milliseconds>
//	    WINDOW <start> <end>   per acquisition, until the time is up
//	    DONE <count>
package main

import (
	"bufio"
	"fmt"
	"io/ioutil"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/samuel/go-zookeeper/zk"
)

func nowMicros() int64 { return time.Now().UnixNano() / 1000 }

func main() {
	hosts, path, mode := os.Args[1], os.Args[2], os.Args[3]
	conn, _, err := zk.Connect(strings.Split(hosts, ","), 10*time.Second, zk.WithLogger(log.New(ioutil.Discard, "", 0)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	lock := zk.NewLock(conn, path, zk.WorldACL(zk.PermAll))
	if mode == "hold" {
		if err := lock.Lock(); err != nil {
			log.Fatal(err)
		}
		fmt.Println("HELD", nowMicros())
		bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Println("RELEASED", nowMicros())
		if err := lock.Unlock(); err != nil {
			log.Fatal(err)
		}
		return
	}
	millis, _ := strconv.Atoi(os.Args[4])
	end := time.Now().Add(time.Duration(millis) * time.Millisecond)
	count := 0
	for time.Now().Before(end) {
		if err := lock.Lock(); err != nil {
			log.Fatal(err)
		}
		start := nowMicros()
		time.Sleep(2 * time.Millisecond)
		stop := nowMicros()
		if err := lock.Unlock(); err != nil {
			log.Fatal(err)
		}
		fmt.Println("WINDOW", start, stop)
		count++
	}
	fmt.Println("DONE", count)
}
