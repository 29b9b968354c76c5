// The launcher behind chorus-run, driven with /bin/sh -c scripts as ranks.
//
// Every job has a safety-net timeout far above its expected run time, so a
// broken launcher fails a test (exit 124) instead of hanging it.
#include "toolkit/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sched.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/env.hpp"

namespace chorus::tools {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr milliseconds kSafetyNet{20000};

// An anonymous in-memory file standing in for the launcher's stdout or stderr.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("launcher_test", MFD_CLOEXEC)) {}
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  [[nodiscard]] int fd() const { return fd_; }
  [[nodiscard]] std::string contents() const {
    std::string out;
    char buf[65536];
    off_t off = 0;
    for (;;) {
      ssize_t n = ::pread(fd_, buf, sizeof(buf), off);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return out;
  }
  [[nodiscard]] std::vector<std::string> lines() const {
    std::vector<std::string> v;
    std::istringstream in(contents());
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  }

 private:
  int fd_;
};

// A job of n ranks, each running `sh -c script`, with its output captured.
struct Job {
  MemFile out, err;
  LaunchOptions opts;

  Job(int n, const std::string& script) {
    opts.nranks = n;
    opts.argv = {"/bin/sh", "-c", script};
    opts.out_fd = out.fd();
    opts.err_fd = err.fd();
    opts.timeout = kSafetyNet;
    opts.name = "test-launcher";
  }
  LaunchReport run() {
    auto r = launch(opts);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return r.isOk() ? std::move(r).value() : LaunchReport{};
  }
};

// A private directory for FIFOs, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "launcher_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Launcher, PrefixesEveryLineAndNeverInterleavesRanks) {
  constexpr int kRanks = 4, kLines = 400;
  const std::string pad(300, 'x');  // long lines make a torn write likely if relaying were not line-based
  Job job(kRanks,
          "i=0; while [ $i -lt " + std::to_string(kLines) + " ]; do echo \"rank $CHORUS_RANK line $i $PAD\"; "
          "echo \"e$CHORUS_RANK $i\" >&2; i=$((i+1)); done; printf 'tail-%s' $CHORUS_RANK");
  job.opts.extra_env = {{"PAD", pad}};
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 0);

  const std::regex line_re(R"(\[(\d+)\] rank (\d+) line (\d+) (x+))");
  const std::regex tail_re(R"(\[(\d+)\] tail-(\d+))");
  std::map<int, int> next;  // rank -> next expected line number
  std::set<int> tails;
  for (const std::string& l : job.out.lines()) {
    std::smatch m;
    if (std::regex_match(l, m, tail_re)) {
      EXPECT_EQ(m[1], m[2]) << l;
      EXPECT_EQ(next[std::stoi(m[1])], kLines) << "partial last line flushed before the rank's other lines";
      tails.insert(std::stoi(m[1]));
      continue;
    }
    ASSERT_TRUE(std::regex_match(l, m, line_re)) << "torn or unprefixed line: " << l.substr(0, 80);
    EXPECT_EQ(m[1], m[2]) << l.substr(0, 80);
    EXPECT_EQ(m[4].length(), pad.size());
    int r = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[3]), next[r]) << "lines of rank " << r << " out of order";
    ++next[r];
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(next[r], kLines) << "rank " << r;
  EXPECT_EQ(tails.size(), size_t{kRanks});

  int err_lines = 0;
  for (const std::string& l : job.err.lines()) {
    EXPECT_TRUE(std::regex_match(l, std::regex(R"(\[(\d)\] e\1 \d+)"))) << l;
    ++err_lines;
  }
  EXPECT_EQ(err_lines, kRanks * kLines);
}

TEST(Launcher, NoPrefixRelaysLinesVerbatim) {
  Job job(2, "echo \"plain $CHORUS_RANK\"");
  job.opts.prefix_stdout = false;
  EXPECT_EQ(job.run().exit_code, 0);
  EXPECT_THAT(job.out.lines(), ::testing::UnorderedElementsAre("plain 0", "plain 1"));
}

TEST(Launcher, SetsTheJobEnvironmentForEveryRank) {
  constexpr int kRanks = 3;
  Job job(kRanks,
          "echo \"$CHORUS_RANK $CHORUS_LOCAL_RANK $CHORUS_WORLD_SIZE $CHORUS_MASTER_ADDR $CHORUS_MASTER_PORT "
          "$CHORUS_SECRET $EXTRA\"");
  job.opts.extra_env = {{"EXTRA", "extra-value"}};
  ASSERT_EQ(job.run().exit_code, 0);

  const std::regex re(R"(\[(\d+)\] (\d+) (\d+) (\d+) (\S+) (\d+) ([0-9a-f]+) (\S+))");
  std::set<std::string> secrets, ports;
  std::set<int> ranks;
  for (const std::string& l : job.out.lines()) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, re)) << l;
    EXPECT_EQ(m[1], m[2]) << "CHORUS_RANK differs from the output prefix";
    EXPECT_EQ(m[2], m[3]) << "CHORUS_LOCAL_RANK differs from CHORUS_RANK on one host";
    EXPECT_EQ(std::stoi(m[4]), kRanks);
    EXPECT_EQ(m[5], "127.0.0.1");
    EXPECT_GT(std::stoi(m[6]), 0);
    EXPECT_EQ(m[7].length(), 64u) << "CHORUS_SECRET must be 32 bytes of hex";
    EXPECT_EQ(m[8], "extra-value");
    ranks.insert(std::stoi(m[2]));
    secrets.insert(m[7]);
    ports.insert(m[6]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(secrets.size(), 1u) << "all ranks of a job share one secret";
  EXPECT_EQ(ports.size(), 1u) << "all ranks of a job share one master port";

  Job again(1, "echo $CHORUS_SECRET");
  ASSERT_EQ(again.run().exit_code, 0);
  ASSERT_EQ(again.out.lines().size(), 1u);
  EXPECT_NE("[0] " + *secrets.begin(), again.out.lines()[0]) << "each job draws a fresh secret";
}

// --bind-to core: rank r runs on the r-th allowed CPU only (round robin when
// ranks outnumber CPUs); without it every rank may run anywhere.
TEST(Launcher, BindToCorePinsRankROnTheRthAllowedCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const int n = static_cast<int>(cpus.size()) + 1;  // one rank more than CPUs: the last wraps around
  Job job(n, "grep Cpus_allowed_list /proc/self/status");
  job.opts.bind_cores = true;
  ASSERT_EQ(job.run().exit_code, 0);
  const std::regex re(R"(\[(\d+)\] Cpus_allowed_list:\s+(\S+))");
  int seen = 0;
  for (const std::string& l : job.out.lines()) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, re)) << l;
    const int r = std::stoi(m[1]);
    EXPECT_EQ(m[2], std::to_string(cpus[static_cast<size_t>(r) % cpus.size()])) << "rank " << r;
    ++seen;
  }
  EXPECT_EQ(seen, n);
  Job free_job(1, "grep Cpus_allowed_list /proc/self/status");
  ASSERT_EQ(free_job.run().exit_code, 0);
  ASSERT_EQ(free_job.out.lines().size(), 1u);
  if (cpus.size() > 1) {  // unbound, the rank may use every CPU we may
    EXPECT_NE(free_job.out.lines()[0], "[0] Cpus_allowed_list:\t" + std::to_string(cpus[0]));
  }
}

TEST(Launcher, FirstFailingRankSetsTheStatusAndTheOthersAreStopped) {
  Job job(3, "if [ $CHORUS_RANK = 1 ]; then echo bye; exit 3; fi; exec sleep 30");
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 3);
  EXPECT_EQ(rep.first_failed_rank, 1);
  EXPECT_FALSE(rep.timed_out);
  for (int r : {0, 2}) {
    EXPECT_TRUE(rep.ranks[r].signaled) << "rank " << r;
    EXPECT_EQ(rep.ranks[r].code, SIGTERM) << "rank " << r;
  }
  EXPECT_EQ(rep.summary, "rank 1 exited with status 3; stopping the other 2 rank(s)");
  EXPECT_THAT(job.err.contents(), HasSubstr("test-launcher: rank 1 exited with status 3"));
  EXPECT_THAT(job.out.lines(), ::testing::ElementsAre("[1] bye"));
}

TEST(Launcher, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  TempDir dir;
  const std::string fifo = dir.path() + "/armed";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Rank 0 fails only once rank 1 has armed its trap, so the test does not
  // depend on which rank the scheduler runs first.
  Job job(2, "if [ $CHORUS_RANK = 0 ]; then read x < " + fifo + "; exit 1; fi; trap '' TERM; echo armed > " + fifo +
                 "; exec sleep 30");
  job.opts.kill_grace = milliseconds(200);
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 1);
  EXPECT_EQ(rep.first_failed_rank, 0);
  EXPECT_TRUE(rep.ranks[1].signaled);
  EXPECT_EQ(rep.ranks[1].code, SIGKILL);
  EXPECT_THAT(job.err.contents(), HasSubstr("sending SIGKILL"));
}

TEST(Launcher, DeathBySignalGives128PlusTheSignal) {
  Job job(2, "if [ $CHORUS_RANK = 1 ]; then kill -USR1 $$; fi; exec sleep 30");
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 128 + SIGUSR1);
  EXPECT_EQ(rep.first_failed_rank, 1);
  EXPECT_THAT(rep.summary, HasSubstr("rank 1 was killed by signal 10 (SIGUSR1)"));
}

TEST(Launcher, TimeoutStopsTheJobWith124) {
  Job job(2, "exec sleep 30");
  job.opts.timeout = milliseconds(300);
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 124);
  EXPECT_TRUE(rep.timed_out);
  EXPECT_EQ(rep.first_failed_rank, -1) << "ranks killed by the launcher are not 'failures'";
  EXPECT_THAT(job.err.contents(), HasSubstr("timed out after 0.3 s"));
}

TEST(Launcher, AllRanksSucceedingGivesZero) {
  Job job(4, "exit 0");
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 0);
  EXPECT_EQ(rep.summary, "");
  for (const RankExit& e : rep.ranks) EXPECT_TRUE(e.reaped && !e.failed());
}

TEST(Launcher, AProgramThatCannotRunExits127WithAMessage) {
  Job job(1, "");
  job.opts.argv = {"/nonexistent/program"};
  LaunchReport rep = job.run();
  EXPECT_EQ(rep.exit_code, 127);
  EXPECT_THAT(job.err.contents(), HasSubstr("[0] test-launcher: cannot execute '/nonexistent/program'"));
}

// Waits up to `limit` for a forked child, via a pidfd (no sleeping).
std::optional<int> waitChild(pid_t pid, milliseconds limit) {
  int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pfd >= 0) {
    pollfd p{pfd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(limit.count()));
    ::close(pfd);
  }
  int st = 0;
  if (::waitpid(pid, &st, WNOHANG) != pid) return std::nullopt;
  return st;
}

TEST(Launcher, ForwardsSigintToEveryRank) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the launcher process
    LaunchOptions o;
    o.nranks = 2;
    o.argv = {"/bin/sh", "-c", "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 1; done"};
    o.out_fd = pipe_fds[1];
    o.err_fd = pipe_fds[1];
    o.timeout = kSafetyNet;
    auto r = launch(o);
    _exit(r.isOk() ? r->exit_code : 99);
  }
  ::close(pipe_fds[1]);
  // Signal only once both ranks have installed their trap.
  std::string seen;
  auto until = std::chrono::steady_clock::now() + kSafetyNet;
  while (std::count(seen.begin(), seen.end(), 'y') < 2 && std::chrono::steady_clock::now() < until) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(pipe_fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    for (char c : std::string_view(buf, static_cast<size_t>(n)))
      if (c == 'y') seen.push_back(c);  // 'y' only occurs in "ready"
  }
  ASSERT_EQ(std::count(seen.begin(), seen.end(), 'y'), 2);
  ASSERT_EQ(::kill(child, SIGINT), 0);
  auto st = waitChild(child, kSafetyNet);
  ::close(pipe_fds[0]);
  if (!st) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << "the launcher did not end after SIGINT";
  }
  ASSERT_TRUE(WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 5) << "the ranks' own exit status after handling SIGINT";
}

TEST(Launcher, RejectsBadOptions) {
  LaunchOptions o;
  o.nranks = 0;
  o.argv = {"true"};
  EXPECT_EQ(launch(o).status().code(), chorusInvalidArgument);
  o.nranks = 1;
  o.argv.clear();
  EXPECT_EQ(launch(o).status().code(), chorusInvalidArgument);
  o.argv = {"true"};
  o.master_addr = "not-an-address";
  EXPECT_EQ(launch(o).status().code(), chorusInvalidArgument);
}

TEST(Launcher, RankEnvironmentReplacesJobVariablesAndKeepsTheRest) {
  RankEnv job{2, 2, 4, "10.0.0.1", 29500, "ab", 29600, 4};
  auto env = rankEnvironment({"PATH=/bin", "CHORUS_RANK=9", "CHORUS_SECRET=old", "FOO=1=2", "MASTER_PORT=1", "RANK=7"},
                             job, {{"FOO", "3"}});
  EXPECT_THAT(env, ::testing::UnorderedElementsAre(
                       "PATH=/bin", "CHORUS_RANK=2", "CHORUS_LOCAL_RANK=2", "CHORUS_WORLD_SIZE=4",
                       "CHORUS_MASTER_ADDR=10.0.0.1", "CHORUS_MASTER_PORT=29500", "CHORUS_SECRET=ab", "FOO=3",
                       // torch.distributed's env:// variables, MASTER_PORT on the second port
                       "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29600", "RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=2",
                       "LOCAL_WORLD_SIZE=4"));
}

// torch's env:// needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torchrun
// also sets LOCAL_RANK, LOCAL_WORLD_SIZE); MASTER_PORT must not be chorus's
// store port, or rank 0's two stores would bind one port.
TEST(Launcher, ExportsTorchEnvInitVariablesOnAPortOfTheirOwn) {
  constexpr int kRanks = 3;
  Job job(kRanks, "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                  "$CHORUS_MASTER_PORT\"");
  ASSERT_EQ(job.run().exit_code, 0);
  const std::regex re(R"(\[(\d+)\] (\d+) (\d+) (\d+) (\d+) (\S+) (\d+) (\d+))");
  std::set<std::string> torch_ports;
  ASSERT_EQ(job.out.lines().size(), static_cast<size_t>(kRanks));
  for (const std::string& l : job.out.lines()) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, re)) << l;
    EXPECT_EQ(m[1], m[2]) << "RANK differs from the output prefix";
    EXPECT_EQ(std::stoi(m[3]), kRanks) << "WORLD_SIZE";
    EXPECT_EQ(m[4], m[2]) << "LOCAL_RANK on one host";
    EXPECT_EQ(std::stoi(m[5]), kRanks) << "LOCAL_WORLD_SIZE";
    EXPECT_EQ(m[6], "127.0.0.1") << "MASTER_ADDR";
    EXPECT_GT(std::stoi(m[7]), 0);
    EXPECT_NE(m[7], m[8]) << "MASTER_PORT must differ from CHORUS_MASTER_PORT";
    torch_ports.insert(m[7]);
  }
  EXPECT_EQ(torch_ports.size(), 1u) << "all ranks share one MASTER_PORT";

  Job fixed(1, "echo $MASTER_PORT $CHORUS_MASTER_PORT");
  fixed.opts.master_port = 29400;
  fixed.opts.torch_port = 29401;
  ASSERT_EQ(fixed.run().exit_code, 0);
  EXPECT_THAT(fixed.out.lines(), ::testing::ElementsAre("[0] 29401 29400"));

  LaunchOptions clash;
  clash.argv = {"true"};
  clash.master_port = clash.torch_port = 29400;
  auto r = launch(clash);
  ASSERT_FALSE(r.isOk());
  EXPECT_THAT(r.status().message(), HasSubstr("MASTER_PORT 29400"));
}

TEST(Launcher, DescribesHowARankEnded) {
  EXPECT_EQ(describeExit(3, RankExit{true, false, 7}), "rank 3 exited with status 7");
  EXPECT_EQ(describeExit(0, RankExit{true, true, SIGKILL}), "rank 0 was killed by signal 9 (SIGKILL)");
  EXPECT_EQ((RankExit{true, true, SIGTERM}).shellStatus(), 128 + SIGTERM);
}

TEST(Launcher, PickFreePortReturnsABindablePort) {
  auto p = pickFreePort("127.0.0.1");
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_GT(*p, 0);
}

TEST(Launcher, KnobTableListsEveryKnobWithItsDefault) {
  std::string table = formatKnobTable();
  for (const env::Knob& k : env::knobs()) {
    EXPECT_THAT(table, HasSubstr(std::string(k.name))) << k.name;
    EXPECT_THAT(table, HasSubstr(std::string(k.meaning))) << k.name;
  }
  EXPECT_THAT(table, ::testing::ContainsRegex("CHORUS_TIMEOUT_MS +600000 "));
}

}  // namespace
}  // namespace chorus::tools
