package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// effect is one line of the effects file: an invocation ran (its user
// code did), once per line.
type effect struct {
	session string
	rec     record
}

func readEffects(path string) ([]effect, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []effect
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sess, rec, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue // a torn line: only from a process killed mid-write
		}
		r, err := parseRecord(rec)
		if err != nil {
			continue
		}
		out = append(out, effect{sess, r})
	}
	return out, sc.Err()
}

// phaseStats is one row of the table.
type phaseStats struct {
	name                                        string
	faults, faultErrs                           int
	started, ok, wrong, lost, stuck, noStart    int
	effects, keyed, dupKeys, reruns, retriedAll int
	skipped                                     int
	times                                       []time.Duration
	examples                                    []string
}

// check is the checker: it reads the sessions' verdicts and the effects
// file, prints the per-phase table and the violations' examples, and
// returns the number of violations and the table.
func (m *modeRun) check() (int, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rows := make([]*phaseStats, len(m.phases))
	for i, n := range m.phases {
		rows[i] = &phaseStats{name: n, skipped: m.skipped[i]}
	}
	phaseOf := map[string]int{}
	for _, s := range m.sessions {
		r := rows[s.phase]
		r.started++
		r.retriedAll += s.retries
		if s.id != "" {
			phaseOf[s.id] = s.phase
		}
		switch s.outcome {
		case outcomeOK:
			r.ok++
			r.times = append(r.times, s.took)
		case outcomeWrong:
			r.wrong++
		case outcomeLost:
			r.lost++
		case outcomeStuck:
			r.stuck++
		case outcomeNoStart:
			r.noStart++
		}
		if s.outcome != outcomeOK && len(r.examples) < 3 {
			r.examples = append(r.examples, fmt.Sprintf("%s %s (%s, %s): %s: %s", s.shape, s.input, s.id, s.took.Round(time.Millisecond), s.outcome, trim(s.detail, 300)))
		}
	}
	for _, f := range m.faults {
		rows[f.phase].faults++
		if f.err != nil {
			rows[f.phase].faultErrs++
		}
	}

	effects, err := readEffects(m.effects)
	effectsNote := ""
	if err != nil {
		effectsNote = "effects file: " + err.Error()
	}
	byKey := map[string]int{}
	byInvocation := map[string]int{}
	anyKey := false
	for _, e := range effects {
		p, ok := phaseOf[e.session]
		if !ok {
			continue // the warm-up sessions, or a start never acknowledged
		}
		rows[p].effects++
		inv := e.session + "/" + e.rec.fn + "/" + e.rec.id + "/" + e.rec.attempt
		byInvocation[inv]++
		if byInvocation[inv] == 2 {
			rows[p].reruns++
		}
		if e.rec.key != "" {
			anyKey = true
			rows[p].keyed++
			byKey[e.rec.key]++
			if byKey[e.rec.key] == 2 {
				rows[p].dupKeys++
				if len(rows[p].examples) < 6 {
					rows[p].examples = append(rows[p].examples, fmt.Sprintf("key %s: effect twice (%s %s %s)", e.rec.key, e.session, e.rec.fn, e.rec.id))
				}
			}
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "chaos checker, %s engine (%s; %s, %.1f sessions/s, work up to %s, session deadline %s, seed %d)\n",
		m.mode, m.describeInstall(), m.cfg.duration, m.cfg.rate, m.cfg.work, m.cfg.sessionDeadline, m.cfg.seed)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nemesis\tfaults\tstarted\tcompleted\twrong\tlost\tstuck\tno start\tduplicates\treruns\tretries\tp50\tp99\t")
	violations := 0
	total := &phaseStats{name: "total"}
	for _, r := range append(rows, total) {
		if r != total {
			total.faults += r.faults
			total.faultErrs += r.faultErrs
			total.started += r.started
			total.ok += r.ok
			total.wrong += r.wrong
			total.lost += r.lost
			total.stuck += r.stuck
			total.noStart += r.noStart
			total.dupKeys += r.dupKeys
			total.reruns += r.reruns
			total.retriedAll += r.retriedAll
			total.skipped += r.skipped
			total.times = append(total.times, r.times...)
			violations += r.wrong + r.lost + r.stuck + r.noStart + r.dupKeys
		}
		faults := fmt.Sprint(r.faults)
		if r.faultErrs > 0 {
			faults += fmt.Sprintf(" (%d err)", r.faultErrs)
		}
		dups := fmt.Sprint(r.dupKeys)
		if !anyKey {
			dups = "no keys"
		}
		started := fmt.Sprint(r.started)
		if r.skipped > 0 {
			started += fmt.Sprintf(" (+%d skipped)", r.skipped)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\t\n", r.name, faults, started, r.ok, r.wrong, r.lost, r.stuck, r.noStart,
			dups, r.reruns, r.retriedAll, pct(r.times, 0.50), pct(r.times, 0.99))
	}
	tw.Flush()
	b.WriteString("completed: right result; wrong: another result or Failed; lost: acknowledged, then unknown; stuck: no answer by the deadline (or Expired);\n" +
		"no start: no start acknowledged by the deadline; duplicates: idempotency keys whose effect happened twice (\"no keys\": the SDK gave none);\n" +
		"reruns: one invocation (id, attempt) whose user code ran twice; retries: client calls retried on an unavailable gateway; p50/p99: completed sessions, start to result;\n" +
		"(+N skipped): starts not made while -max-in-flight sessions were outstanding.\n")
	if effectsNote != "" {
		b.WriteString(effectsNote + "\n")
	}
	for _, r := range rows {
		for _, e := range r.examples {
			fmt.Fprintf(&b, "  %s: %s\n", r.name, e)
		}
	}
	fmt.Fprintf(&b, "%s: %d violations\n", m.mode, violations)
	fmt.Fprintf(m.out, "\n%s", b.String())
	return violations, b.String()
}

func pct(ds []time.Duration, p float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))].Round(10 * time.Millisecond).String()
}

func trim(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
