#include "toolkit/launcher.hpp"

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

#include <chorus/device.h>

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

std::string formatMemorySpaces(std::string_view prefix) {
  std::string out;
  const std::pair<chorusMemSpace_t, const char*> spaces[] = {
      {chorusMemHost, "host"}, {chorusMemOpenCL, "opencl"}, {chorusMemCuda, "cuda"}};
  for (const auto& [space, name] : spaces) {
    int available = 0;
    char why[512] = {};
    if (chorusMemSpaceQuery(space, &available, why, sizeof why) != chorusSuccess) continue;
    out += fmt::format("{}memory space {:<6}: {}\n", prefix, name,
                       available ? std::string("yes") : fmt::format("no ({})", why));
  }
  return out;
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

namespace {

struct JobPorts {
  uint16_t store = 0;  // chorus's store: CHORUS_MASTER_PORT
  uint16_t torch = 0;  // torch's env:// store: MASTER_PORT
};

Result<JobPorts> choosePorts(const LaunchOptions& o) {
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
  return JobPorts{port, torch_port};
}

// One job from its set-up to the last reap: the ranks, their output streams
// and the shutdown's timers.  Streams point at the sinks, so a Job stays where
// it was built.
class Job {
 public:
  Job(const LaunchOptions& o, JobPorts ports, std::string secret)
      : o_(o),
        n_(o.nranks),
        ports_(ports),
        secret_(std::move(secret)),
        exec_error_(fmt::format("{}: cannot execute '{}': ", o.name, o.argv[0])),
        base_env_(currentEnvironment()),
        out_sink_{o.out_fd},
        err_sink_{o.err_fd},
        pids_(static_cast<size_t>(o.nranks), -1),
        alive_(o.nranks) {
    // Everything the child needs is built before fork: after it, only
    // async-signal-safe calls.
    for (const std::string& a : o.argv) argv_.push_back(const_cast<char*>(a.c_str()));
    argv_.push_back(nullptr);
    report_.ranks.resize(static_cast<size_t>(n_));
    streams_.reserve(2 * static_cast<size_t>(n_));
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Blocks the signals the launcher reads from its signalfd, and opens the
  // ranks' stdin.
  Status blockSignals() {
    sigset_t sigs;
    sigemptyset(&sigs);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&sigs, s);
    if (int err = pthread_sigmask(SIG_BLOCK, &sigs, &cleanup_.old_mask); err != 0)
      return errnoError(fmt::format("{}: pthread_sigmask", o_.name), err);
    cleanup_.mask_saved = true;
    sfd_ = ::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd_ < 0) return errnoError(fmt::format("{}: signalfd", o_.name), errno);
    cleanup_.fds.push_back(sfd_);
    devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull_ < 0) return errnoError(fmt::format("{}: open /dev/null", o_.name), errno);
    cleanup_.fds.push_back(devnull_);
    return {};
  }

  // --bind-to core: the CPUs we may use, in order.
  Status findCpus() {
    if (!o_.bind_cores) return {};
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0)
      return errnoError(fmt::format("{}: sched_getaffinity for --bind-to core", o_.name), errno);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus_.push_back(c);
    if (cpus_.empty()) return systemError("{}: --bind-to core: this process may run on no CPU", o_.name);
    return {};
  }

  Status startRanks() {
    launcher_pid_ = ::getpid();
    for (int r = 0; r < n_; ++r) CHORUS_RETURN_IF_ERROR(startRank(r));
    return {};
  }

  // Relays output and handles signals, failures and timers until every rank
  // is reaped and its pipes are drained.
  Status supervise() {
    if (o_.timeout) deadline_ = Clock::now() + *o_.timeout;
    for (;;) {
      auto now = Clock::now();
      if (alive_ == 0 && !drain_until_) drain_until_ = now + kDrainAfterExit;
      bool open = std::any_of(streams_.begin(), streams_.end(), [](const Stream& s) { return s.fd >= 0; });
      if (alive_ == 0 && (!open || now >= *drain_until_)) break;

      std::vector<pollfd> pfds;
      std::vector<Stream*> polled;
      if (alive_ > 0) pfds.push_back({sfd_, POLLIN, 0});
      for (Stream& s : streams_)
        if (s.fd >= 0) {
          pfds.push_back({s.fd, POLLIN, 0});
          polled.push_back(&s);
        }
      int rc = ::poll(pfds.data(), pfds.size(), pollTimeoutMs(now));
      if (rc < 0 && errno != EINTR) {
        int err = errno;
        signalLive(SIGKILL);
        killStarted();
        return errnoError(fmt::format("{}: poll", o_.name), err);
      }
      now = Clock::now();
      size_t first_stream = 0;
      if (alive_ > 0) {
        first_stream = 1;
        if (rc > 0 && (pfds[0].revents & POLLIN)) readSignals(now);
      }
      for (size_t i = first_stream; rc > 0 && i < pfds.size(); ++i)
        if (pfds[i].revents != 0) readStream(*polled[i - first_stream]);
      checkTimers(now);
    }
    for (Stream& s : streams_)
      if (s.fd >= 0) finishStream(s);
    return {};
  }

  LaunchReport finish() {
    if (report_.timed_out) {
      report_.exit_code = 124;
    } else if (report_.first_failed_rank >= 0) {
      report_.exit_code = report_.ranks[static_cast<size_t>(report_.first_failed_rank)].shellStatus();
    } else if (report_.forwarded_signal != 0) {
      report_.exit_code = 128 + report_.forwarded_signal;
    }
    return std::move(report_);
  }

 private:
  Status startRank(int r) {
    RankEnv job{r, r, n_, o_.master_addr, ports_.store, secret_, ports_.torch, n_};
    cpu_set_t bind;
    CPU_ZERO(&bind);
    if (!cpus_.empty()) CPU_SET(cpus_[static_cast<size_t>(r) % cpus_.size()], &bind);
    std::vector<std::string> env_strings = rankEnvironment(base_env_, job, o_.extra_env);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
      int err = errno;
      killStarted();
      return errnoError(fmt::format("{}: pipe for rank {}", o_.name, r), err);
    }
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      int err = errno;
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      killStarted();
      return errnoError(fmt::format("{}: pipe for rank {}", o_.name, r), err);
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      killStarted();
      return errnoError(fmt::format("{}: fork for rank {}", o_.name, r), err);
    }
    if (pid == 0) execRank(bind, envp.data(), out_pipe[1], err_pipe[1]);
    ::setpgid(pid, pid);  // also from here, so the group exists before we might signal it
    pids_[static_cast<size_t>(r)] = pid;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    for (int fd : {out_pipe[0], err_pipe[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    streams_.push_back(Stream{out_pipe[0], r, &out_sink_, o_.prefix_stdout, {}});
    streams_.push_back(Stream{err_pipe[0], r, &err_sink_, o_.prefix_stderr, {}});
    return {};
  }

  // The child: async-signal-safe calls only, then exec.
  [[noreturn]] void execRank(const cpu_set_t& bind, char* const* envp, int out_fd, int err_fd) const {
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
    pthread_sigmask(SIG_SETMASK, &cleanup_.old_mask, nullptr);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!cpus_.empty() && ::sched_setaffinity(0, sizeof bind, &bind) != 0) _exit(127);
    if (::getppid() != launcher_pid_) _exit(127);  // the launcher died before prctl took effect
    ::dup2(devnull_, 0);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execvpe(argv_[0], argv_.data(), envp);
    int err = errno;
    ssize_t ignored = ::write(2, exec_error_.data(), exec_error_.size());
    const char* msg = strerrordesc_np(err);
    if (msg) ignored = ::write(2, msg, strlen(msg));
    ignored = ::write(2, "\n", 1);
    (void)ignored;
    _exit(127);
  }

  void killStarted() {
    for (pid_t p : pids_)
      if (p > 0) {
        ::kill(-p, SIGKILL);
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    for (Stream& s : streams_)
      if (s.fd >= 0) ::close(s.fd);
  }

  // Until the earliest timer that can still fire (-1: none).
  int pollTimeoutMs(Clock::time_point now) const {
    std::optional<Clock::time_point> wake;
    auto earliest = [&](std::optional<Clock::time_point> t) {
      if (t && (!wake || *t < *wake)) wake = t;
    };
    if (alive_ > 0 && !report_.timed_out && report_.first_failed_rank < 0) earliest(deadline_);
    if (alive_ > 0 && !killed_hard_) earliest(kill_at_);
    if (alive_ == 0) earliest(drain_until_);
    if (!wake) return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(*wake - now).count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
  }

  void readSignals(Clock::time_point now) {
    signalfd_siginfo si{};
    bool child = false;
    while (::read(sfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        child = true;
      } else if (report_.forwarded_signal == 0) {
        report_.forwarded_signal = sig;
        err_sink_.write(fmt::format("{}: received SIG{}, forwarding it to {} rank(s)\n", o_.name, sigabbrev_np(sig),
                                    alive_));
        signalLive(sig);
        if (!kill_at_) kill_at_ = now + o_.kill_grace;
      } else {  // a second interrupt: the user means it
        signalLive(SIGKILL);
        killed_hard_ = true;
      }
    }
    if (child) reap(now);
  }

  static void readStream(Stream& s) {
    if (s.fd < 0) return;  // finished while its rank was reaped above
    std::array<char, 65536> buf;
    ssize_t got = ::read(s.fd, buf.data(), buf.size());
    if (got > 0) {
      relay(s, std::string_view(buf.data(), static_cast<size_t>(got)));
    } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
      finishStream(s);
    }
  }

  void checkTimers(Clock::time_point now) {
    // A job already stopping because a rank failed keeps that rank's status.
    if (alive_ > 0 && deadline_ && !report_.timed_out && report_.first_failed_rank < 0 && now >= *deadline_) {
      report_.timed_out = true;
      say(fmt::format("timed out after {:.3g} s; stopping {} rank(s)",
                      std::chrono::duration<double>(*o_.timeout).count(), alive_));
      shutDown(now);
    }
    if (alive_ > 0 && kill_at_ && !killed_hard_ && now >= *kill_at_) {
      err_sink_.write(fmt::format("{}: {} rank(s) still running after {} ms; sending SIGKILL\n", o_.name, alive_,
                                  o_.kill_grace.count()));
      signalLive(SIGKILL);
      killed_hard_ = true;
    }
  }

  void say(std::string line) {
    report_.summary = line;
    err_sink_.write(fmt::format("{}: {}\n", o_.name, line));
  }

  void signalLive(int sig) {
    for (int r = 0; r < n_; ++r)
      if (!report_.ranks[static_cast<size_t>(r)].reaped) ::kill(-pids_[static_cast<size_t>(r)], sig);
  }

  void shutDown(Clock::time_point now) {  // SIGTERM now, SIGKILL after the grace period
    signalLive(SIGTERM);
    if (!kill_at_) kill_at_ = now + o_.kill_grace;
  }

  void reap(Clock::time_point now) {
    for (int r = 0; r < n_; ++r) {
      RankExit& e = report_.ranks[static_cast<size_t>(r)];
      if (e.reaped) continue;
      int st = 0;
      pid_t got = ::waitpid(pids_[static_cast<size_t>(r)], &st, WNOHANG);
      if (got <= 0) continue;
      e.reaped = true;
      e.signaled = WIFSIGNALED(st);
      e.code = e.signaled ? WTERMSIG(st) : WEXITSTATUS(st);
      --alive_;
      // Its output is all in the pipes now: relay it first, so the line about
      // how it ended comes after what it said.
      for (Stream& s : streams_)
        if (s.rank == r) drainStream(s);
      if (e.failed() && report_.first_failed_rank < 0 && !report_.timed_out) {
        report_.first_failed_rank = r;
        say(alive_ > 0 ? fmt::format("{}; stopping the other {} rank(s)", describeExit(r, e), alive_)
                       : describeExit(r, e));
        shutDown(now);
      }
    }
  }

  const LaunchOptions& o_;
  const int n_;
  const JobPorts ports_;
  const std::string secret_;
  const std::string exec_error_;
  const std::vector<std::string> base_env_;
  std::vector<char*> argv_;
  Cleanup cleanup_;
  int sfd_ = -1;
  int devnull_ = -1;
  std::vector<int> cpus_;  // --bind-to core: the CPUs we may use, in order
  pid_t launcher_pid_ = 0;
  Sink out_sink_;
  Sink err_sink_;
  LaunchReport report_;
  std::vector<pid_t> pids_;
  std::vector<Stream> streams_;
  int alive_;
  std::optional<Clock::time_point> deadline_;
  std::optional<Clock::time_point> kill_at_;  // SIGKILL whoever is left at this time
  bool killed_hard_ = false;
  std::optional<Clock::time_point> drain_until_;
};

}  // namespace

Result<LaunchReport> launch(const LaunchOptions& o) {
  if (o.nranks < 1) return invalidArgument("{}: -n {} is not a valid number of ranks (use 1 or more)", o.name, o.nranks);
  if (o.argv.empty() || o.argv[0].empty())
    return invalidArgument("{}: no program to run (usage: {} -n N [--] prog args...)", o.name, o.name);
  CHORUS_ASSIGN_OR_RETURN(const JobPorts ports, choosePorts(o));
  Job job(o, ports, auth::Secret::random().toHex());
  CHORUS_RETURN_IF_ERROR(job.blockSignals());
  CHORUS_RETURN_IF_ERROR(job.findCpus());
  CHORUS_RETURN_IF_ERROR(job.startRanks());
  CHORUS_RETURN_IF_ERROR(job.supervise());
  return job.finish();
}

}  // namespace chorus::tools
