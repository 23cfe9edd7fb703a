// Command echo is the test image of the local cluster's node agent
// (catalog image ziptrail.dev/e2e/echo:latest). It serves HTTP on $PORT
// (default 8080) and can be told to misbehave, so specs can observe what the
// node does:
//
//	GET  /            "echo from <pod> (<ip>)" plus the request path
//	GET  /env?name=X  the value of environment variable X
//	GET  /file?path=P the contents of file P (volumes, /etc/resolv.conf, …)
//	GET  /healthz     200, or 503 while not ready (see below)
//	POST /ready?ok=false|true   flips readiness
//	GET  /hook?name=N[&sleep=D] logs "hook N called" (lifecycle hooks), then waits D
//
// Environment (or the matching -flag):
//
//	CRASH_AFTER=5s       exit 1 after this long (-crash-after)
//	NOT_READY_FILE=/p    /healthz fails while this file exists (-not-ready-file)
//	LOG_EVERY=1s         log a numbered line this often (-log-every)
//	LOG_LINES=a,b        log these lines at start (-log-lines)
//	TERM_DELAY=10s       on SIGTERM, log and keep serving this long before
//	                     exiting (-term-delay); "forever" ignores SIGTERM
//	EXIT_CODE=0          exit immediately with this code (-exit-code)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func main() {
	port := flag.String("port", env("PORT", "8080"), "listen port")
	crashAfter := flag.String("crash-after", env("CRASH_AFTER", ""), "exit 1 after this duration")
	notReadyFile := flag.String("not-ready-file", env("NOT_READY_FILE", ""), "not ready while this file exists")
	logEvery := flag.String("log-every", env("LOG_EVERY", ""), "log a numbered line this often")
	logLines := flag.String("log-lines", env("LOG_LINES", ""), "comma-separated lines to log at start")
	termDelay := flag.String("term-delay", env("TERM_DELAY", ""), "on SIGTERM keep running this long (or forever)")
	exitCode := flag.String("exit-code", env("EXIT_CODE", ""), "exit at once with this code")
	flag.Parse()
	log.SetFlags(0)
	log.SetOutput(os.Stdout)

	name, _ := os.Hostname()
	if v := os.Getenv("POD_NAME"); v != "" {
		name = v
	}
	log.Printf("echo starting: pod=%s ip=%s port=%s", name, podIP(), *port)
	if *exitCode != "" {
		code, _ := strconv.Atoi(*exitCode)
		log.Printf("exiting with code %d", code)
		os.Exit(code)
	}
	for _, l := range strings.Split(*logLines, ",") {
		if l != "" {
			log.Print(l)
		}
	}
	if d := parse(*crashAfter); d > 0 {
		time.AfterFunc(d, func() {
			log.Printf("crashing after %s", d)
			os.Exit(1)
		})
	}
	if d := parse(*logEvery); d > 0 {
		go func() {
			for i := 1; ; i++ {
				time.Sleep(d)
				log.Printf("line %d", i)
			}
		}()
	}

	var notReady atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "echo from %s (%s) %s\n", name, podIP(), r.URL.Path)
	})
	mux.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, os.Getenv(r.URL.Query().Get("name")))
	})
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		data, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		_, _ = w.Write(data)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if notReady.Load() {
			http.Error(w, "not ready (toggled)", http.StatusServiceUnavailable)
			return
		}
		if *notReadyFile != "" {
			if _, err := os.Stat(*notReadyFile); err == nil {
				http.Error(w, "not ready: "+*notReadyFile+" exists", http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintf(w, "ok %s", r.Header.Get("User-Agent"))
	})
	mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("hook %s called (User-Agent %q)", r.URL.Query().Get("name"), r.UserAgent())
		if d := parse(r.URL.Query().Get("sleep")); d > 0 {
			time.Sleep(d)
		}
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST", http.StatusMethodNotAllowed)
			return
		}
		notReady.Store(r.URL.Query().Get("ok") == "false")
		fmt.Fprintf(w, "ready=%v", !notReady.Load())
	})
	srv := &http.Server{Addr: ":" + *port, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
			log.Printf("serve: %v", err)
			os.Exit(2)
		}
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	log.Printf("received %v", s)
	switch {
	case *termDelay == "forever":
		log.Printf("ignoring %v", s)
		select {}
	case parse(*termDelay) > 0:
		log.Printf("delaying exit by %s", parse(*termDelay))
		time.Sleep(parse(*termDelay))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	log.Printf("exiting")
}

func parse(s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		log.Printf("bad duration %q: %v", s, err)
		return 0
	}
	return d
}

func podIP() string {
	if v := os.Getenv("POD_IP"); v != "" {
		return v
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}
