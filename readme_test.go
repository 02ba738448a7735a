package memolock

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every Go block in the README is a piece of an example in
// example_test.go, so it compiles with the package.
func TestReadmeGoBlocksCompileAsExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The blocks come from the examples, which compile and run: the
	// library's, and the OpenTelemetry example's, a module of its own.
	var source string
	for _, f := range []string{"example_test.go", "examples/otel/main.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		source += normalize(string(b))
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("no Go blocks in README.md")
	}
	for _, b := range blocks {
		if !strings.Contains(source, normalize(b[1])) {
			t.Errorf("README block is not in example_test.go:\n%s", b[1])
		}
	}
}

// normalize drops each line's indentation and blank lines.
func normalize(s string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n") + "\n"
}
