package memolock

import (
	"os"
	"strings"
	"testing"
)

func TestProtocolDocQuotesEveryScriptVerbatim(t *testing.T) {
	doc, err := os.ReadFile("interop/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{
		"acquire": acquireSrc, "store": storeSrc, "release": releaseSrc, "renew": renewSrc,
		"delete": deleteSrc, "set": setSrc, "peek": peekSrc, "publish": publishSrc,
		"not_found": notFoundSrc, "resurrect": resurrectSrc,
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
	if eventFail != "fail" || eventAbandon != "abandon" || eventNotFound != "notfound" || eventStale != "stale" {
		t.Error("event kinds changed; update interop/PROTOCOL.md")
	}
}
