// Command otel serves memolock's OpenTelemetry metrics to Prometheus: it
// wires the OpenTelemetry SDK to a Prometheus exporter, makes it the
// global MeterProvider (which memolock uses unless Options.MeterProvider
// says otherwise), computes a value through memolock, and serves /metrics.
//
//	go run . --redis redis://127.0.0.1:6379 --listen 127.0.0.1:9464
//	curl -s 127.0.0.1:9464/metrics | grep ^memolock_
//
// It is a module of its own, so that the library's go.mod does not depend
// on Prometheus.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/memolock/memolock"
)

func main() {
	url := flag.String("redis", "redis://127.0.0.1:6379", "Redis URL")
	listen := flag.String("listen", "127.0.0.1:9464", "address to serve /metrics on")
	flag.Parse()
	if err := run(*url, *listen); err != nil {
		log.Fatal(err)
	}
}

func run(url, listen string) error {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return errors.New("bad --redis URL") // its text may quote a password
	}
	mux := http.NewServeMux()
	mp, err := serveMetrics(mux, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer mp.Shutdown(context.Background())

	rdb := redis.NewClient(opts)
	defer rdb.Close()
	c, err := memolock.New(rdb, "example", nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := getOnce(c); err != nil {
		return err
	}
	fmt.Printf("metrics at http://%s/metrics\n", listen)
	return http.ListenAndServe(listen, mux)
}

// serveMetrics makes memolock's metrics, and anything else measured
// through the global MeterProvider, readable by Prometheus at /metrics.
func serveMetrics(mux *http.ServeMux, reg *prometheus.Registry) (*sdkmetric.MeterProvider, error) {
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	otel.SetMeterProvider(mp) // memolock.New takes the global provider by default
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mp, nil
}

// getOnce computes a value through memolock, so that there is something
// to see.
func getOnce(c *memolock.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Get(ctx, "greeting", func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return []byte("hello"), time.Minute, nil
	})
	return err
}
