// franz-go (github.com/twmb/franz-go), a Go client, as an application uses it, for the
// tests, which build it with the Go toolchain:
//
//	client produce BOOTSTRAP TOPIC COUNT
//	client consume BOOTSTRAP TOPIC GROUP COUNT
//
// Prints PRODUCED n, or CONSUMED n: the distinct values read (a record delivered twice counts
// once), after committing; it reads for 60 seconds at most and commits within 30.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	mode, bootstrap, topic := os.Args[1], os.Args[2], os.Args[3]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if mode == "produce" {
		count, _ := strconv.Atoi(os.Args[4])
		client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.AllowAutoTopicCreation())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer client.Close()
		records := make([]*kgo.Record, count)
		for i := range records {
			records[i] = &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("go-%d", i))}
		}
		acked := 0
		for _, result := range client.ProduceSync(ctx, records...) {
			if result.Err == nil {
				acked++
			} else {
				fmt.Fprintln(os.Stderr, result.Err)
			}
		}
		fmt.Printf("PRODUCED %d\n", acked)
		return
	}
	group := os.Args[4]
	count, _ := strconv.Atoi(os.Args[5])
	client, err := kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	values := map[string]struct{}{}
	for len(values) < count && ctx.Err() == nil {
		fetches := client.PollFetches(ctx)
		fetches.EachError(func(t string, p int32, err error) {
			if ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, t, p, err)
			}
		})
		fetches.EachRecord(func(record *kgo.Record) { values[string(record.Value)] = struct{}{} })
	}
	commit, done := context.WithTimeout(context.Background(), 30*time.Second)
	defer done()
	if err := client.CommitUncommittedOffsets(commit); err != nil {
		fmt.Fprintln(os.Stderr, "commit:", err)
		os.Exit(1)
	}
	fmt.Printf("CONSUMED %d\n", len(values))
}
