package memolock

import (
	"os"
	"strings"
	"testing"

	"github.com/memolock/memolock/internal/wire"
)

func TestProtocolDocQuotesEveryScriptVerbatim(t *testing.T) {
	doc, err := os.ReadFile("interop/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{
		"acquire": wire.AcquireSrc, "store": wire.StoreSrc, "release": wire.ReleaseSrc, "renew": wire.RenewSrc,
		"delete": wire.DeleteSrc, "set": wire.SetSrc, "peek": wire.PeekSrc, "publish": wire.PublishSrc,
		"not_found": wire.NotFoundSrc, "resurrect": wire.ResurrectSrc,
	} {
		if !strings.Contains(string(doc), "### "+name+"\n") || !strings.Contains(string(doc), "```lua\n"+src+"```") {
			t.Errorf("interop/PROTOCOL.md does not quote the %s script exactly", name)
		}
	}
	for _, s := range []string{"T:I", "T/lock:I", "T/notif:I", "T/lock-event:I", "fail\\n<token>\\n<message>", "abandon\\n<token>\\n",
		"notfound\\n<token>\\n", "stale\\n<token>\\n"} {
		if !strings.Contains(string(doc), s) {
			t.Errorf("interop/PROTOCOL.md does not mention %q", s)
		}
	}
	ks, _ := NewKeyScheme("T")
	for _, got := range []string{ks.Value("I"), ks.Lock("I"), ks.Notif("I"), ks.Events("I"), ks.NotFound("I"), ks.Stale("I")} {
		if !strings.Contains(string(doc), "`"+got+"`") {
			t.Errorf("key scheme name %q is not in interop/PROTOCOL.md", got)
		}
	}
	if wire.EventFail != "fail" || wire.EventAbandon != "abandon" || wire.EventNotFound != "notfound" || wire.EventStale != "stale" {
		t.Error("event kinds changed; update interop/PROTOCOL.md")
	}
}
