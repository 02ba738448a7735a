package interop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/memolock/memolock/internal/redistest"
)

// The C# peer's project files (csharp/src/MemoLockNet.csproj and
// csharp/cli/memolock.csproj, SDK-style for dotnet) build with Mono's
// xbuild, which reads them as classic projects, and what they build runs:
// a C# team can drop them into a solution without build.sh. CI installs
// mono-xbuild; dotnet is not on these machines, so only xbuild is checked.
func TestCSharpProjectsBuildWithXbuild(t *testing.T) {
	need(t, csharpRT)
	if _, err := exec.LookPath("xbuild"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("xbuild not found and CI=true (apt-get install -y mono-xbuild)")
		}
		t.Skip("xbuild not found (apt-get install -y mono-xbuild)")
	}
	// Release, so that a developer's Debug build is left alone.
	build := exec.Command("xbuild", "/nologo", "/verbosity:minimal", "/p:Configuration=Release",
		filepath.Join(here, "csharp", "cli", "memolock.csproj"))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("xbuild cli/memolock.csproj: %v\n%s", err, out)
	}
	for _, f := range []string{"src/bin/Release/MemoLockNet.dll", "cli/bin/Release/MemoLockNet.dll"} {
		if _, err := os.Stat(filepath.Join(here, "csharp", f)); err != nil {
			t.Errorf("xbuild did not make %s: %v", f, err)
		}
	}

	srv := redistest.Start(t)
	run := exec.Command("mono", filepath.Join(here, "csharp", "cli", "bin", "Release", "memolock.exe"),
		"run", "--redis", "redis://"+srv.Addr, "--tag", "xbuild", "--id-hex", "6869", "--ttl", "1m", "--", "echo", "built by xbuild")
	out, err := run.CombinedOutput()
	if err != nil || string(out) != "built by xbuild\n" {
		t.Fatalf("the CLI xbuild built: %v, output %q", err, out)
	}
	rdb := srv.Client(t)
	if v, err := rdb.Get(context.Background(), "xbuild:hi").Result(); err != nil || v != "built by xbuild\n" {
		t.Errorf("stored value: %q, %v", v, err)
	}
}
