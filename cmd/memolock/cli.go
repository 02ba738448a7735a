package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A command is one subcommand: what its help page says, and how it runs.
// Every help page has the same parts, in the same order, so that a reader
// (or a script) finds them: a one-line summary, usage lines, what the
// command does, its flags with their defaults and units, the environment,
// the exit status, and examples.
type command struct {
	name    string
	summary string   // one line, no final period
	usage   []string // after "memolock "
	about   string   // paragraphs, separated by blank lines
	flags   []string // the order of the Flags section; flags not listed follow, sorted
	env     bool     // reads $MEMOLOCK_REDIS
	exits   [][2]string
	example [][2]string // a comment, then a command line
}

// The flags that every Redis command shares, worded once.
const (
	redisUsage   = "`URL` of the Redis server: redis://[[user]:password@]host:port[/db], rediss:// for TLS, unix:///path/to.sock (default $MEMOLOCK_REDIS, then " + defaultRedisURL + ")"
	clusterUsage = "--redis names a Redis Cluster, other seed nodes as addr parameters: redis://host1:7000?addr=host2:7000"
	quietUsage   = "print no status line (errors only)"
)

var commands = []*command{&runCommand, &demoCommand, &inspectCommand, &watchCommand, &checkCommand, &versionCommand, &helpCommand}

var versionCommand = command{
	name:    "version",
	summary: "print memolock's version, and the Go that built it",
	usage:   []string{"version", "--version"},
	exits:   [][2]string{{"0", "always"}},
}

var helpCommand = command{
	name:    "help",
	summary: "show the help page of a command",
	usage:   []string{"help [COMMAND]", "COMMAND --help"},
	exits:   [][2]string{{"0", "the page was printed"}, {"2", "no such command"}},
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// mainHelp is the page of `memolock --help`.
func mainHelp(w io.Writer) {
	var b strings.Builder
	b.WriteString("memolock shares the result of an expensive computation between processes and\n" +
		"machines through Redis: the first caller computes, every other one waits for\n" +
		"its value, which Redis then keeps for a while.\n\n")
	b.WriteString("Usage:\n  memolock COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString("\nRun 'memolock COMMAND --help' (or 'memolock help COMMAND') for the flags, exit\n" +
		"status and examples of a command.\n\n")
	b.WriteString("Redis:\n")
	b.WriteString(wrap("run, inspect, watch and check take --redis URL: redis://[[user]:password@]host:port[/db], "+
		"rediss:// for TLS, or unix:///path/to.sock. Without --redis they use $MEMOLOCK_REDIS, then "+defaultRedisURL+
		". With --cluster, the URL names a Redis Cluster: redis://host1:7000?addr=host2:7000 (seed nodes). "+
		"A password goes before the @, after a colon: redis://:PASSWORD@host. Passwords are never printed.", "  ", 80))
	b.WriteString("\nExit status:\n")
	b.WriteString("  0    done\n  1    failed: Redis unreachable or refusing, a check that failed\n  2    bad usage\n")
	b.WriteString("  run passes its command's own status through: see 'memolock run --help'.\n")
	b.WriteString("\nExamples:\n")
	b.WriteString("  memolock demo\n")
	b.WriteString("  memolock run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11\n")
	b.WriteString("  memolock check --redis redis://app:PASSWORD@cache:6379 --tag reports\n")
	_, _ = io.WriteString(w, b.String())
}

// printHelp prints the help page of c, whose flags fs holds.
func printHelp(w io.Writer, c *command, fs *flag.FlagSet) {
	var b strings.Builder
	fmt.Fprintf(&b, "memolock %s: %s\n\nUsage:\n", c.name, c.summary)
	for _, u := range c.usage {
		fmt.Fprintf(&b, "  memolock %s\n", u)
	}
	if c.about != "" {
		for _, p := range strings.Split(strings.TrimSpace(c.about), "\n\n") {
			b.WriteString("\n")
			if strings.HasPrefix(p, " ") {
				b.WriteString(p + "\n") // laid out by hand
				continue
			}
			b.WriteString(wrap(p, "", 80))
		}
	}
	if fs != nil {
		b.WriteString("\nFlags:\n")
		for _, f := range orderedFlags(fs, c.flags) {
			name, usage := flag.UnquoteUsage(f)
			left := "  --" + f.Name
			if name != "" {
				left += " " + name
			}
			if def := f.DefValue; def != "" && def != "0" && def != "0s" && def != "false" {
				usage += " (default " + def + ")"
			}
			b.WriteString(column(left, usage))
		}
		b.WriteString(column("  -h, --help", "show this help"))
	}
	if c.env {
		b.WriteString("\nEnvironment:\n")
		b.WriteString(column("  MEMOLOCK_REDIS", "the Redis URL when --redis is not given (never printed: it may hold a password)"))
	}
	if len(c.exits) > 0 {
		b.WriteString("\nExit status:\n")
		for _, e := range c.exits {
			b.WriteString(columnAt("  "+e[0], e[1], 11))
		}
	}
	if len(c.example) > 0 {
		b.WriteString("\nExamples:\n")
		for i, e := range c.example {
			if i > 0 {
				b.WriteString("\n")
			}
			b.WriteString(wrap(e[0], "  # ", 80))
			fmt.Fprintf(&b, "  %s\n", e[1])
		}
	}
	_, _ = io.WriteString(w, b.String())
}

// orderedFlags returns the flags of fs: those named in order first, then
// the others, sorted, so that none is ever left off a help page.
func orderedFlags(fs *flag.FlagSet, order []string) []*flag.Flag {
	var out []*flag.Flag
	listed := map[string]bool{}
	for _, name := range order {
		if f := fs.Lookup(name); f != nil && !listed[name] {
			listed[name] = true
			out = append(out, f)
		}
	}
	var rest []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !listed[f.Name] {
			rest = append(rest, f)
		}
	})
	sort.Slice(rest, func(i, j int) bool { return rest[i].Name < rest[j].Name })
	return append(out, rest...)
}

const flagColumn = 26

// column prints a term and its text, the text wrapped in a column of its
// own.
func column(term, text string) string { return columnAt(term, text, flagColumn) }

func columnAt(term, text string, at int) string {
	pad := strings.Repeat(" ", at)
	body := wrap(text, pad, 80)
	if len(term) < at-1 {
		return term + body[len(term):]
	}
	return term + "\n" + body
}

// wrap fills text into lines of at most width columns, each after indent.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
	return b.String()
}

// parse parses args into fs, the flags of c. It reports false, with the
// exit code, when the command should stop: after printing the help page
// on stdout (0) for -h or --help, or after a usage error on stderr (2).
func parse(c *command, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (int, bool) {
	// The flag package's own messages name flags as -name and dump the
	// whole usage: ours say --name and point at the help page.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		printHelp(stdout, c, fs)
		return 0, false
	}
	fmt.Fprintf(flagOutput(stderr, args), "memolock %s: %s\n", c.name, flagError(err))
	fmt.Fprintf(stderr, "Run 'memolock %s --help' for usage.\n", c.name)
	return exitUsage, false
}

// usageError says on stderr what is wrong with the command line of c, and
// where its help page is, and returns the exit code of bad usage.
func usageError(c *command, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "memolock %s: %s\n", c.name, fmt.Sprintf(format, args...))
	fmt.Fprintf(stderr, "Run 'memolock %s --help' for usage.\n", c.name)
	return exitUsage
}

var (
	flagInvalid    = regexp.MustCompile(`^invalid value (".*") for flag -([^:]+): (.*)$`)
	flagInvalidB   = regexp.MustCompile(`^invalid boolean value (".*") for -([^:]+): .*$`)
	flagNeedsValue = regexp.MustCompile(`^flag needs an argument: -(.*)$`)
	flagUnknown    = regexp.MustCompile(`^flag provided but not defined: -(.*)$`)
)

// flagError rewords an error of the flag package with flags as --name.
func flagError(err error) string {
	msg := err.Error()
	if m := flagInvalid.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s %s: %s", m[2], m[1], m[3])
	}
	if m := flagInvalidB.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s %s: a switch takes no value (or =true, =false)", m[2], m[1])
	}
	if m := flagNeedsValue.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s needs a value", m[1])
	}
	if m := flagUnknown.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("unknown flag --%s", m[1])
	}
	return msg
}

// durationFlag is a flag of a duration, which must carry a unit: "--ttl 5"
// means nothing to time.ParseDuration, and an operator should not have to
// guess whether it is seconds.
type durationFlag struct{ d *time.Duration }

func newDuration(fs *flag.FlagSet, name string, def time.Duration, usage string) *time.Duration {
	d := def
	fs.Var(durationFlag{&d}, name, usage)
	return &d
}

func (f durationFlag) String() string {
	if f.d == nil {
		return "0s"
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err == nil {
		*f.d = d
		return nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return fmt.Errorf("a duration needs a unit: %ss, %sms, %sm or %sh", s, s, s, s)
	}
	return errors.New("not a duration: write it as 500ms, 30s, 10m or 1h30m")
}

// intFlag is a flag of a whole number, with an error that says so.
type intFlag struct{ n *int }

func newInt(fs *flag.FlagSet, name string, def int, usage string) *int {
	n := def
	fs.Var(intFlag{&n}, name, usage)
	return &n
}

func (f intFlag) String() string {
	if f.n == nil {
		return "0"
	}
	return strconv.Itoa(*f.n)
}

func (f intFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not a whole number")
	}
	*f.n = n
	return nil
}

// version prints memolock's version: the module's, the commit it was
// built from when the build knows it, and the Go that built it.
func version(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if code, ok := parse(&versionCommand, fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(&versionCommand, stderr, "unexpected argument %q", redactArg(fs.Arg(0)))
	}
	fmt.Fprintln(stdout, versionLine())
	return 0
}

func versionLine() string {
	v, extra := "(unknown)", ""
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Version != "" {
			v = info.Main.Version
		}
		var rev, at string
		modified := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			extra = " (commit " + rev
			if modified {
				extra += ", modified"
			}
			if at != "" {
				extra += ", " + at
			}
			extra += ")"
		}
	}
	return fmt.Sprintf("memolock %s%s %s %s/%s", v, extra, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// help prints the page of the command named in args, or the main one.
func help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		mainHelp(stdout)
		return 0
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		printHelp(stdout, &helpCommand, nil)
		return 0
	}
	c := findCommand(args[0])
	if c == &helpCommand {
		printHelp(stdout, c, nil)
		return 0
	}
	if c == nil {
		fmt.Fprintf(stderr, "memolock help: unknown command %q\nRun 'memolock --help' for the list.\n", redactArg(args[0]))
		return exitUsage
	}
	return dispatch(c.name, []string{"--help"}, stdout, stderr)
}
