#include "tools/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <string_view>

#include "bootstrap/auth.hpp"
#include "common/env.hpp"

extern char** environ;

namespace chorus::tools {
namespace {

using Clock = std::chrono::steady_clock;

// After the last rank is reaped, how long to keep reading pipes that a rank's
// leftover children may still hold open.
constexpr std::chrono::milliseconds kDrainAfterExit{1000};

// Where relayed output goes.  Once a write fails (the reader went away) the
// sink drops output instead of failing the job: supervision matters more.
struct Sink {
  int fd = -1;
  bool broken = false;

  void write(std::string_view data) {
    while (!broken && !data.empty()) {
      ssize_t n = ::write(fd, data.data(), data.size());
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {  // a non-blocking fd we inherited: wait for room
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
      } else {
        broken = true;
      }
    }
  }
};

// One output pipe of one rank and the bytes of its unfinished line.
struct Stream {
  int fd = -1;  // read end; -1 after EOF
  int rank = 0;
  Sink* sink = nullptr;
  bool prefix = true;
  std::string pending;
};

void appendLine(const Stream& s, std::string& out, std::string_view line) {
  if (s.prefix) out += fmt::format("[{}] ", s.rank);
  out.append(line);
  out.push_back('\n');
}

// Appends data to the stream and writes every line it completes, in one write.
void relay(Stream& s, std::string_view data) {
  s.pending.append(data);
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    appendLine(s, out, std::string_view(s.pending).substr(start, nl - start));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  while (s.pending.size() >= kMaxLineBytes) {  // no newline in sight: split rather than buffer forever
    appendLine(s, out, std::string_view(s.pending).substr(0, kMaxLineBytes));
    s.pending.erase(0, kMaxLineBytes);
  }
  if (!out.empty()) s.sink->write(out);
}

void finishStream(Stream& s) {
  if (!s.pending.empty()) {
    std::string out;
    appendLine(s, out, s.pending);
    s.pending.clear();
    s.sink->write(out);
  }
  ::close(s.fd);
  s.fd = -1;
}

// Reads whatever the pipe holds now, without waiting.
void drainStream(Stream& s) {
  std::array<char, 65536> buf;
  while (s.fd >= 0) {
    ssize_t got = ::read(s.fd, buf.data(), buf.size());
    if (got > 0) {
      relay(s, std::string_view(buf.data(), static_cast<size_t>(got)));
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      if (got == 0 || errno != EAGAIN) finishStream(s);
      return;
    }
  }
}

// Restores the caller's signal mask and closes the launcher's fds on every
// return path.
struct Cleanup {
  sigset_t old_mask{};
  bool mask_saved = false;
  std::vector<int> fds;
  ~Cleanup() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    if (mask_saved) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  }
};

std::vector<std::string> currentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::string_view nameOf(std::string_view entry) { return entry.substr(0, entry.find('=')); }

}  // namespace

Result<uint16_t> pickFreePort(const std::string& addr) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, addr.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, addr.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof(sockaddr_in6);
  } else {
    return invalidArgument("launcher: master address '{}' is not a numeric IPv4 or IPv6 address", addr);
  }
  int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoError("launcher: socket() for picking a free port", errno);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    int err = errno;
    ::close(fd);
    return errnoError(fmt::format("launcher: bind({}:0) for picking a free port", addr), err);
  }
  socklen_t got = sizeof(ss);
  int rc = ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &got);
  int err = errno;
  ::close(fd);
  if (rc != 0) return errnoError("launcher: getsockname", err);
  return ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
}

std::vector<std::string> rankEnvironment(const std::vector<std::string>& base, const RankEnv& job,
                                         const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"CHORUS_RANK", std::to_string(job.rank)},
      {"CHORUS_LOCAL_RANK", std::to_string(job.local_rank)},
      {"CHORUS_WORLD_SIZE", std::to_string(job.world_size)},
      {"CHORUS_MASTER_ADDR", job.master_addr},
      {"CHORUS_MASTER_PORT", std::to_string(job.master_port)},
      {"CHORUS_SECRET", job.secret_hex},
      // torch.distributed's env:// (and torchrun-style scripts).  chorus's own
      // init reads the CHORUS_* values above first, so the two stores never
      // meet on one port.
      {"MASTER_ADDR", job.master_addr},
      {"MASTER_PORT", std::to_string(job.torch_port)},
      {"RANK", std::to_string(job.rank)},
      {"WORLD_SIZE", std::to_string(job.world_size)},
      {"LOCAL_RANK", std::to_string(job.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(job.local_world_size)},
  };
  set.insert(set.end(), extra.begin(), extra.end());
  std::vector<std::string> env;
  env.reserve(base.size() + set.size());
  for (const std::string& e : base) {
    bool replaced = std::any_of(set.begin(), set.end(), [&](const auto& kv) { return nameOf(e) == kv.first; });
    if (!replaced) env.push_back(e);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

std::string describeExit(int rank, const RankExit& e) {
  if (e.signaled) {
    const char* abbrev = sigabbrev_np(e.code);
    return fmt::format("rank {} was killed by signal {} (SIG{})", rank, e.code, abbrev ? abbrev : "?");
  }
  return fmt::format("rank {} exited with status {}", rank, e.code);
}

std::string formatKnobTable() {
  size_t name_w = 4, def_w = 7;  // "NAME", "DEFAULT"
  for (const env::Knob& k : env::knobs()) {
    name_w = std::max(name_w, k.name.size());
    def_w = std::max(def_w, k.default_value.size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {}\n", "NAME", name_w, "DEFAULT", def_w, "MEANING");
  for (const env::Knob& k : env::knobs())
    out += fmt::format("{:<{}}  {:<{}}  {}\n", k.name, name_w, k.default_value.empty() ? "-" : k.default_value,
                       def_w, k.meaning);
  return out;
}

Result<LaunchReport> launch(const LaunchOptions& o) {
  if (o.nranks < 1) return invalidArgument("{}: -n {} is not a valid number of ranks (use 1 or more)", o.name, o.nranks);
  if (o.argv.empty() || o.argv[0].empty())
    return invalidArgument("{}: no program to run (usage: {} -n N [--] prog args...)", o.name, o.name);
  const int n = o.nranks;

  uint16_t port = o.master_port;
  if (port == 0) {
    CHORUS_ASSIGN_OR_RETURN(port, pickFreePort(o.master_addr));
  }
  uint16_t torch_port = o.torch_port;
  if (torch_port != 0 && torch_port == port)
    return invalidArgument("{}: torch's MASTER_PORT {} is chorus's store port too (CHORUS_MASTER_PORT); give them "
                           "different ports",
                           o.name, torch_port);
  // The kernel hands out ephemeral ports in turn, so a second pick differs
  // from the first unless the range wrapped; a few tries settle that case.
  for (int tries = 0; torch_port == 0 || torch_port == port; ++tries) {
    if (tries == 8) return systemError("{}: no second free port on {} for MASTER_PORT", o.name, o.master_addr);
    CHORUS_ASSIGN_OR_RETURN(torch_port, pickFreePort(o.master_addr));
  }
  const std::string secret = auth::Secret::random().toHex();

  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::vector<std::string> base_env = currentEnvironment();
  const std::string exec_error = fmt::format("{}: cannot execute '{}': ", o.name, o.argv[0]);

  Cleanup cleanup;
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&sigs, s);
  if (int err = pthread_sigmask(SIG_BLOCK, &sigs, &cleanup.old_mask); err != 0)
    return errnoError(fmt::format("{}: pthread_sigmask", o.name), err);
  cleanup.mask_saved = true;
  int sfd = ::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return errnoError(fmt::format("{}: signalfd", o.name), errno);
  cleanup.fds.push_back(sfd);
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) return errnoError(fmt::format("{}: open /dev/null", o.name), errno);
  cleanup.fds.push_back(devnull);

  Sink out_sink{o.out_fd};
  Sink err_sink{o.err_fd};
  LaunchReport report;
  report.ranks.resize(static_cast<size_t>(n));
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  std::vector<Stream> streams;
  streams.reserve(2 * static_cast<size_t>(n));
  const pid_t launcher_pid = ::getpid();

  auto killStarted = [&] {
    for (pid_t p : pids)
      if (p > 0) {
        ::kill(-p, SIGKILL);
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    for (Stream& s : streams)
      if (s.fd >= 0) ::close(s.fd);
  };

  std::vector<int> cpus;  // --bind-to core: the CPUs we may use, in order
  if (o.bind_cores) {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0)
      return errnoError(fmt::format("{}: sched_getaffinity for --bind-to core", o.name), errno);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    if (cpus.empty()) return systemError("{}: --bind-to core: this process may run on no CPU", o.name);
  }

  for (int r = 0; r < n; ++r) {
    RankEnv job{r, r, n, o.master_addr, port, secret, torch_port, n};
    cpu_set_t bind;
    CPU_ZERO(&bind);
    if (!cpus.empty()) CPU_SET(cpus[static_cast<size_t>(r) % cpus.size()], &bind);
    std::vector<std::string> env_strings = rankEnvironment(base_env, job, o.extra_env);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
      int err = errno;
      killStarted();
      return errnoError(fmt::format("{}: pipe for rank {}", o.name, r), err);
    }
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      int err = errno;
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      killStarted();
      return errnoError(fmt::format("{}: pipe for rank {}", o.name, r), err);
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      killStarted();
      return errnoError(fmt::format("{}: fork for rank {}", o.name, r), err);
    }
    if (pid == 0) {
      // The child: async-signal-safe calls only, then exec.
      struct sigaction dfl{};
      dfl.sa_handler = SIG_DFL;
      for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
      pthread_sigmask(SIG_SETMASK, &cleanup.old_mask, nullptr);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (!cpus.empty() && ::sched_setaffinity(0, sizeof bind, &bind) != 0) _exit(127);
      if (::getppid() != launcher_pid) _exit(127);  // the launcher died before prctl took effect
      ::dup2(devnull, 0);
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
      ::execvpe(argv[0], argv.data(), envp.data());
      int err = errno;
      ssize_t ignored = ::write(2, exec_error.data(), exec_error.size());
      const char* msg = strerrordesc_np(err);
      if (msg) ignored = ::write(2, msg, strlen(msg));
      ignored = ::write(2, "\n", 1);
      (void)ignored;
      _exit(127);
    }
    ::setpgid(pid, pid);  // also from here, so the group exists before we might signal it
    pids[static_cast<size_t>(r)] = pid;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    for (int fd : {out_pipe[0], err_pipe[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    streams.push_back(Stream{out_pipe[0], r, &out_sink, o.prefix_stdout, {}});
    streams.push_back(Stream{err_pipe[0], r, &err_sink, o.prefix_stderr, {}});
  }

  const auto start = Clock::now();
  std::optional<Clock::time_point> deadline;
  if (o.timeout) deadline = start + *o.timeout;
  std::optional<Clock::time_point> kill_at;  // SIGKILL whoever is left at this time
  bool killed_hard = false;
  std::optional<Clock::time_point> drain_until;
  int alive = n;

  auto say = [&](std::string line) {
    report.summary = line;
    err_sink.write(fmt::format("{}: {}\n", o.name, line));
  };
  auto signalLive = [&](int sig) {
    for (int r = 0; r < n; ++r)
      if (!report.ranks[static_cast<size_t>(r)].reaped) ::kill(-pids[static_cast<size_t>(r)], sig);
  };
  auto shutDown = [&](Clock::time_point now) {  // SIGTERM now, SIGKILL after the grace period
    signalLive(SIGTERM);
    if (!kill_at) kill_at = now + o.kill_grace;
  };
  auto reap = [&](Clock::time_point now) {
    for (int r = 0; r < n; ++r) {
      RankExit& e = report.ranks[static_cast<size_t>(r)];
      if (e.reaped) continue;
      int st = 0;
      pid_t got = ::waitpid(pids[static_cast<size_t>(r)], &st, WNOHANG);
      if (got <= 0) continue;
      e.reaped = true;
      e.signaled = WIFSIGNALED(st);
      e.code = e.signaled ? WTERMSIG(st) : WEXITSTATUS(st);
      --alive;
      // Its output is all in the pipes now: relay it first, so the line about
      // how it ended comes after what it said.
      for (Stream& s : streams)
        if (s.rank == r) drainStream(s);
      if (e.failed() && report.first_failed_rank < 0 && !report.timed_out) {
        report.first_failed_rank = r;
        say(alive > 0 ? fmt::format("{}; stopping the other {} rank(s)", describeExit(r, e), alive)
                      : describeExit(r, e));
        shutDown(now);
      }
    }
  };

  for (;;) {
    auto now = Clock::now();
    if (alive == 0 && !drain_until) drain_until = now + kDrainAfterExit;
    bool open = std::any_of(streams.begin(), streams.end(), [](const Stream& s) { return s.fd >= 0; });
    if (alive == 0 && (!open || now >= *drain_until)) break;

    std::vector<pollfd> pfds;
    std::vector<Stream*> polled;
    if (alive > 0) pfds.push_back({sfd, POLLIN, 0});
    for (Stream& s : streams)
      if (s.fd >= 0) {
        pfds.push_back({s.fd, POLLIN, 0});
        polled.push_back(&s);
      }
    std::optional<Clock::time_point> wake;
    auto earliest = [&](std::optional<Clock::time_point> t) {
      if (t && (!wake || *t < *wake)) wake = t;
    };
    if (alive > 0 && !report.timed_out && report.first_failed_rank < 0) earliest(deadline);
    if (alive > 0 && !killed_hard) earliest(kill_at);
    if (alive == 0) earliest(drain_until);
    int wait_ms = -1;
    if (wake) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(*wake - now).count();
      wait_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
    }
    int rc = ::poll(pfds.data(), pfds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) {
      int err = errno;
      signalLive(SIGKILL);
      killStarted();
      return errnoError(fmt::format("{}: poll", o.name), err);
    }
    now = Clock::now();
    size_t first_stream = 0;
    if (alive > 0) {
      first_stream = 1;
      if (rc > 0 && (pfds[0].revents & POLLIN)) {
        signalfd_siginfo si{};
        bool child = false;
        while (::read(sfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
          int sig = static_cast<int>(si.ssi_signo);
          if (sig == SIGCHLD) {
            child = true;
          } else if (report.forwarded_signal == 0) {
            report.forwarded_signal = sig;
            err_sink.write(fmt::format("{}: received SIG{}, forwarding it to {} rank(s)\n", o.name,
                                       sigabbrev_np(sig), alive));
            signalLive(sig);
            if (!kill_at) kill_at = now + o.kill_grace;
          } else {  // a second interrupt: the user means it
            signalLive(SIGKILL);
            killed_hard = true;
          }
        }
        if (child) reap(now);
      }
    }
    for (size_t i = first_stream; rc > 0 && i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      Stream& s = *polled[i - first_stream];
      if (s.fd < 0) continue;  // finished while its rank was reaped above
      std::array<char, 65536> buf;
      ssize_t got = ::read(s.fd, buf.data(), buf.size());
      if (got > 0) {
        relay(s, std::string_view(buf.data(), static_cast<size_t>(got)));
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        finishStream(s);
      }
    }
    // A job already stopping because a rank failed keeps that rank's status.
    if (alive > 0 && deadline && !report.timed_out && report.first_failed_rank < 0 && now >= *deadline) {
      report.timed_out = true;
      say(fmt::format("timed out after {:.3g} s; stopping {} rank(s)",
                      std::chrono::duration<double>(*o.timeout).count(), alive));
      shutDown(now);
    }
    if (alive > 0 && kill_at && !killed_hard && now >= *kill_at) {
      err_sink.write(fmt::format("{}: {} rank(s) still running after {} ms; sending SIGKILL\n", o.name, alive,
                                 o.kill_grace.count()));
      signalLive(SIGKILL);
      killed_hard = true;
    }
  }
  for (Stream& s : streams)
    if (s.fd >= 0) finishStream(s);

  if (report.timed_out) {
    report.exit_code = 124;
  } else if (report.first_failed_rank >= 0) {
    report.exit_code = report.ranks[static_cast<size_t>(report.first_failed_rank)].shellStatus();
  } else if (report.forwarded_signal != 0) {
    report.exit_code = 128 + report.forwarded_signal;
  }
  return report;
}

}  // namespace chorus::tools
