module github.com/memolock/memolock/bench

go 1.25.0

replace github.com/memolock/memolock => ../

require (
	github.com/go-redis/cache/v9 v9.0.0
	github.com/memolock/memolock v0.0.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/redis/rueidis v1.0.78
	github.com/redis/rueidis/rueidisaside v1.0.78
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.18.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/klauspost/compress v1.13.6 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/petermattis/goid v0.0.0-20261109124353-7cfa343ad0ab // indirect
	github.com/vmihailenco/go-tinylfu v0.2.2 // indirect
	github.com/vmihailenco/msgpack/v5 v5.3.4 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.40.0 // indirect
	go.opentelemetry.io/otel/metric v1.40.0 // indirect
	go.opentelemetry.io/otel/trace v1.40.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
