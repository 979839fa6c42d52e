// Package testcluster starts real Consul and Nomad agents on loopback ports for
// integration tests, with the freshly built device plugin in their plugin_dir,
// and tears them down (processes, mounts, files) when the test ends.
package testcluster

import (
	"bufio"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePorts returns n distinct loopback ports that were free a moment ago,
// below the kernel's ephemeral range (32768 and up). The many outgoing
// connections of tests running side by side take their local ports there,
// and one could take a port handed out before its agent binds it. Each
// port is handed out once per test binary; other test binaries start at
// random places in the range.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries > 20000 {
			t.Fatalf("find a free port: none free in %d..%d", portsLow, portsHigh)
		}
		if nextPort < portsLow || nextPort >= portsHigh {
			nextPort = portsLow + rand.Intn(portsHigh-portsLow)
		}
		p := nextPort
		nextPort++
		if handedOut[p] || !free(p) {
			continue
		}
		handedOut[p] = true
		ports = append(ports, p)
	}
	return ports
}

// The range FreePorts hands ports out of.
const portsLow, portsHigh = 10000, 20000 // below Nomad's dynamic task ports (20000-32000) too

var (
	portsMu   sync.Mutex
	nextPort  int
	handedOut = map[int]bool{}
)

// free says no one listens on port, TCP or UDP (Serf uses both).
func free(port int) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}

// builds holds one build per package (and race setting) per test binary.
var builds sync.Map // "<package path> <race>" → *build

type build struct {
	once sync.Once
	path string
	err  error
}

// buildOnce builds a main package of this module once per test binary; race
// turns on the race detector in it.
func buildOnce(t testing.TB, pkg, name string, race bool) string {
	t.Helper()
	v, _ := builds.LoadOrStore(fmt.Sprint(pkg, race), &build{})
	b := v.(*build)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "nomad-gpu-build-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		args := []string{"build", "-trimpath", "-o", b.path} // -trimpath as releases: their packages come from the same cache
		if race {
			args = append(args, "-race")
		}
		cflags := "-Wno-deprecated-declarations"
		if name == "nomad-device-gpu" {
			// Built as released, for glibc 2.17 (scripts/plugin-flags.sh).
			out, err := exec.Command(filepath.Join(moduleRoot(t), "scripts", "plugin-flags.sh")).Output()
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if err != nil || len(lines) != 3 {
				b.err = fmt.Errorf("scripts/plugin-flags.sh: %v: %q", err, out)
				return
			}
			cflags += " " + lines[0]
			args = append(args, "-tags", lines[1], "-ldflags", lines[2])
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Env = append(os.Environ(), "CGO_CFLAGS="+cflags)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build %s: %v\n%s", name, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// PluginBinary builds cmd/nomad-device-gpu once per test binary.
func PluginBinary(t testing.TB) string {
	return buildOnce(t, "github.com/nomad-gpu/nomad-gpu/cmd/nomad-device-gpu", "nomad-device-gpu", false)
}

// BrokerBinary builds cmd/gpu-broker, with the race detector, once per test binary.
func BrokerBinary(t testing.TB) string {
	return buildOnce(t, "github.com/nomad-gpu/nomad-gpu/cmd/gpu-broker", "gpu-broker", true)
}

// BrokerReleaseBinary builds cmd/gpu-broker as released, for benchmarks.
func BrokerReleaseBinary(t testing.TB) string {
	return buildOnce(t, "github.com/nomad-gpu/nomad-gpu/cmd/gpu-broker", "gpu-broker", false)
}

// process is a started agent whose output goes to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

func start(t testing.TB, name, dir string, bin string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = dir
	// Its own process group, so that plugins and task executors die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	return p
}

// stop interrupts the agent, then kills its whole process group.
func (p *process) stop() {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
		}
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// Kill ends the agent at once, as a crashed machine would (a Nomad
// client's tasks stay until the test's cleanup).
func (p *process) Kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// Exited reports whether the agent process has ended.
func (p *process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Log returns the agent's output so far.
func (p *process) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// dumpOnFailure prints the end of the agent log when the test failed.
func dumpOnFailure(t testing.TB, p *process) {
	if !t.Failed() {
		return
	}
	t.Logf("last lines of %s:\n%s", p.name, lastLines(p.Log(), 80))
}

// lastLines is the last n lines of log.
func lastLines(log string, n int) string {
	lines := strings.Split(log, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// killTasksUnder kills Nomad task executors whose files are below dir, with
// their tasks: each executor leads a session of its own, which the agent's
// process group does not reach.
func killTasksUnder(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var sessions []int
	for _, p := range procs {
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), "executor") || !strings.Contains(string(cmdline), dir+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
			sessions = append(sessions, pid)
		}
	}
	if len(sessions) == 0 {
		return
	}
	for _, p := range procs {
		stat, err := os.ReadFile(p + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command (in parentheses): state ppid pgrp session ...
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 4 {
			continue
		}
		sid, _ := strconv.Atoi(fields[3])
		for _, s := range sessions {
			if sid == s {
				pid, _ := strconv.Atoi(filepath.Base(p))
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// unmountUnder detaches mounts a Nomad client left below dir (secrets tmpfs,
// alloc dirs), so the directory can be removed.
func unmountUnder(dir string) {
	if runtime.GOOS != "linux" {
		return
	}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return
	}
	defer f.Close()
	var targets []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && strings.HasPrefix(fields[1], dir+"/") {
			targets = append(targets, fields[1])
		}
	}
	for i := len(targets) - 1; i >= 0; i-- {
		syscall.Unmount(targets[i], syscall.MNT_DETACH)
	}
}

// WaitFor polls cond until it returns nil or the timeout passes, then fails
// the test with cond's last error.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
