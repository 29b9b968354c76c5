// Unique ids, environment discovery (with the environment restored after each
// test), Slurm node lists, host identity and the reserved listener.
#include "bootstrap/bootstrap.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <cstring>
#include <map>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/store.hpp"

namespace chorus::bootstrap {
namespace {

using namespace std::chrono_literals;

// Every variable readEnvJob looks at; each test starts with all of them unset
// and the fixture puts the original values back.
const char* const kJobVars[] = {"CHORUS_RANK",    "CHORUS_WORLD_SIZE",  "CHORUS_MASTER_ADDR",   "CHORUS_MASTER_PORT",
                                "CHORUS_SECRET",  "CHORUS_REQUIRE_SECRET", "RANK",              "WORLD_SIZE",
                                "MASTER_ADDR",    "MASTER_PORT",        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                "SLURM_PROCID",   "SLURM_NTASKS",       "SLURM_JOB_NODELIST",   "SLURM_NODELIST",
                                "SLURM_JOB_ID",   "CHORUS_SOCKET_IFNAME", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri",
                                "CHORUS_SECRET_FILE", "CHORUS_SECRET_DIR", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                "SLURM_STEP_ID", "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "XDG_RUNTIME_DIR"};

// A fresh private directory (0700), removed with its files at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/chorus-secret-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kJobVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      unsetenv(v);
    }
    // Per-job secret files of one-host jobs go here, not to /tmp/chorus-<uid>.
    setenv("CHORUS_SECRET_DIR", secret_dir_.path.c_str(), 1);
  }
  TempDir secret_dir_;
  void TearDown() override {
    for (const char* v : kJobVars) unsetenv(v);
    for (auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  static void set(const char* k, const char* v) { setenv(k, v, 1); }
  static void unset(const char* k) { unsetenv(k); }

 private:
  std::map<std::string, std::string> saved_;
};

UniqueId sampleId(const char* host) {
  UniqueId id;
  id.root = *net::resolve(host, 29500);
  id.secret = auth::Secret::random();
  return id;
}

TEST(UniqueIdCodec, RoundTripIpv4AndIpv6) {
  for (const char* host : {"10.1.2.3", "fd00::1:2"}) {
    UniqueId id = sampleId(host);
    chorusUniqueId raw = id.encode();
    auto back = UniqueId::decode(raw);
    ASSERT_TRUE(back.isOk()) << back.status().message();
    EXPECT_EQ(back->root.toString(), id.root.toString());
    EXPECT_EQ(back->secret.bytes, id.secret.bytes);
    EXPECT_TRUE(back->secret.present);
  }
  UniqueId none = sampleId("127.0.0.1");
  none.secret = auth::Secret{};
  auto back = UniqueId::decode(none.encode());
  ASSERT_TRUE(back.isOk());
  EXPECT_FALSE(back->secret.present);
}

TEST(UniqueIdCodec, LayoutMatchesTheHeader) {
  UniqueId id = sampleId("1.2.3.4");
  chorusUniqueId raw = id.encode();
  auto* p = reinterpret_cast<const unsigned char*>(raw.internal);
  EXPECT_EQ(std::memcmp(p, "CHORUSID", 8), 0);
  EXPECT_EQ(p[8] | p[9] << 8, 1);          // version
  EXPECT_EQ(p[10] | p[11] << 8, 4);        // family
  EXPECT_EQ(p[12] | p[13] << 8, 29500);    // port
  EXPECT_EQ(p[16], 1);
  EXPECT_EQ(p[19], 4);
  EXPECT_EQ(std::memcmp(p + 32, id.secret.bytes.data(), 32), 0);
  EXPECT_EQ(p[64], 1);  // flags: secret present
  for (int i = 68; i < 128; ++i) EXPECT_EQ(p[i], 0) << i;
}

TEST(UniqueIdCodec, RejectsCorruption) {
  chorusUniqueId good = sampleId("10.0.0.1").encode();
  auto corrupt = [&](int offset, unsigned char value) {
    chorusUniqueId c = good;
    c.internal[offset] = static_cast<char>(value);
    return UniqueId::decode(c);
  };
  EXPECT_EQ(corrupt(0, 'X').status().code(), chorusInvalidArgument);    // magic
  EXPECT_EQ(corrupt(8, 2).status().code(), chorusInvalidArgument);      // version
  EXPECT_EQ(corrupt(10, 5).status().code(), chorusInvalidArgument);     // family
  EXPECT_EQ(corrupt(14, 1).status().code(), chorusInvalidArgument);     // pad
  EXPECT_EQ(corrupt(20, 1).status().code(), chorusInvalidArgument);     // IPv4 address padding
  EXPECT_EQ(corrupt(65, 1).status().code(), chorusInvalidArgument);     // unknown flag
  EXPECT_EQ(corrupt(127, 1).status().code(), chorusInvalidArgument);    // tail
  EXPECT_EQ(corrupt(70, 9).status().code(), chorusInvalidArgument);     // tail
  chorusUniqueId zero_port = good;
  zero_port.internal[12] = zero_port.internal[13] = 0;
  EXPECT_FALSE(UniqueId::decode(zero_port).isOk());
  chorusUniqueId no_flag = good;
  no_flag.internal[64] = 0;  // secret bytes without the flag
  EXPECT_FALSE(UniqueId::decode(no_flag).isOk());
  chorusUniqueId zeros{};
  auto r = UniqueId::decode(zeros);
  EXPECT_EQ(r.status().code(), chorusInvalidArgument);
  EXPECT_NE(r.status().message().find("chorusGetUniqueId"), std::string::npos);
  // The secret and the port are data, not structure: changing them still decodes.
  EXPECT_TRUE(corrupt(40, 0x55).isOk());
}

TEST(UniqueIdTest, MakeUniqueIdReservesAListenerTheServerAdopts) {
  auto id = makeUniqueId("lo");
  ASSERT_TRUE(id.isOk()) << id.status().message();
  EXPECT_EQ(id->root.family(), AF_INET);
  EXPECT_NE(id->root.port(), 0);
  EXPECT_TRUE(id->secret.present);
  auto decoded = UniqueId::decode(id->encode());
  ASSERT_TRUE(decoded.isOk());
  auto listener = takeReservedListener(decoded->root);
  ASSERT_TRUE(listener.has_value());
  EXPECT_FALSE(takeReservedListener(decoded->root).has_value());  // taken once
  auto server = StoreServer::start(std::move(*listener), decoded->secret);
  ASSERT_TRUE(server.isOk()) << server.status().message();
  EXPECT_EQ((*server)->address().toString(), id->root.toString());
  auto c = connectStore(decoded->root, decoded->secret, 5s);
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(*(*c)->add("n", 1), 1);
  // Without an interface the id still gets some usable address.
  auto any = makeUniqueId("");
  ASSERT_TRUE(any.isOk()) << any.status().message();
  EXPECT_TRUE(takeReservedListener(any->root).has_value());
  auto bad = makeUniqueId("nosuchif0");
  EXPECT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("nosuchif0"), std::string::npos);
}

TEST_F(EnvTest, NothingSetNamesTheLaunchers) {
  auto j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_RANK"), std::string::npos);
  EXPECT_NE(j.status().message().find("SLURM_PROCID"), std::string::npos);
}

TEST_F(EnvTest, ChorusVariablesWinOverTorchrun) {
  set("CHORUS_RANK", "1");
  set("CHORUS_WORLD_SIZE", "4");
  set("CHORUS_MASTER_ADDR", "chorus-host");
  set("CHORUS_MASTER_PORT", "1234");
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("MASTER_ADDR", "torch-host");
  set("MASTER_PORT", "29500");
  auto j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->source, "chorus");
  EXPECT_EQ(j->rank, 1);
  EXPECT_EQ(j->world_size, 4);
  EXPECT_EQ(j->master_addr, "chorus-host");
  EXPECT_EQ(j->master_port, 1234);
  EXPECT_FALSE(j->secret.present);
}

TEST_F(EnvTest, Torchrun) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("MASTER_ADDR", "torch-host");
  set("MASTER_PORT", "29500");
  set("OMPI_COMM_WORLD_RANK", "0");  // lower precedence
  auto j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->source, "torchrun");
  EXPECT_EQ(j->rank, 3);
  EXPECT_EQ(j->world_size, 8);
  EXPECT_EQ(j->master_addr, "torch-host");
  // torchrun's agent already listens on MASTER_PORT: chorus's store takes the next one.
  EXPECT_EQ(j->master_port, 29501);
  EXPECT_NE(j->port_origin.find("MASTER_PORT + 1"), std::string::npos) << j->port_origin;
  set("MASTER_PORT", "65535");
  auto top = readEnvJob();
  ASSERT_FALSE(top.isOk());
  EXPECT_NE(top.status().message().find("MASTER_PORT=65535"), std::string::npos) << top.status().message();
  set("CHORUS_MASTER_PORT", "4000");  // exactly this port, not + 1
  EXPECT_EQ(readEnvJob()->master_port, 4000);
  unset("CHORUS_MASTER_PORT");
  unset("MASTER_PORT");
  auto missing = readEnvJob();
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("MASTER_PORT"), std::string::npos) << missing.status().message();
}

// mpirun sets no master: with every rank on this host it is loopback, over
// several hosts mpirun's host; the port comes from the job id, alike on every rank.
TEST_F(EnvTest, OpenMpiDerivesTheMasterFromItsOwnVariables) {
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "3");
  auto j = readEnvJob();
  ASSERT_FALSE(j.isOk()) << "no local size, no mpirun URI: nothing to derive the master from";
  EXPECT_NE(j.status().message().find("CHORUS_MASTER_ADDR"), std::string::npos) << j.status().message();

  set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  set("OMPI_MCA_ess_base_jobid", "1608450049");
  j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->master_addr, "127.0.0.1");
  const uint16_t port = j->master_port;
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 32000);
  set("OMPI_COMM_WORLD_RANK", "0");  // every rank derives the same port
  EXPECT_EQ(readEnvJob()->master_port, port);
  set("OMPI_MCA_ess_base_jobid", "1608450050");  // another job, another port
  EXPECT_NE(readEnvJob()->master_port, port);
  unset("OMPI_MCA_ess_base_jobid");
  set("PMIX_NAMESPACE", "prterun-node1-4242@1");  // Open MPI 5
  ASSERT_TRUE(readEnvJob().isOk());

  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");  // ranks on two hosts: mpirun's host
  set("OMPI_MCA_orte_hnp_uri", "1608450048.0;tcp://192.0.2.2:58645;tcp6://[fd00::2]:48863");
  j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->master_addr, "192.0.2.2");
  EXPECT_NE(j->addr_origin.find("mpirun"), std::string::npos) << j->addr_origin;
}

TEST_F(EnvTest, OpenMpiWithAnExplicitMaster) {
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "3");
  set("CHORUS_MASTER_ADDR", "10.0.0.9");
  set("CHORUS_MASTER_PORT", "4000");
  auto j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->source, "openmpi");
  EXPECT_EQ(j->rank, 2);
  EXPECT_EQ(j->world_size, 3);
  EXPECT_EQ(j->master_addr, "10.0.0.9");
}

TEST_F(EnvTest, SlurmUsesNodeListAndJobIdPort) {
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "16");
  set("SLURM_JOB_NODELIST", "gpu[07-10,12],login1");
  set("SLURM_JOB_ID", "123456");
  auto j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->source, "slurm");
  EXPECT_EQ(j->rank, 5);
  EXPECT_EQ(j->world_size, 16);
  EXPECT_EQ(j->master_addr, "gpu07");
  EXPECT_EQ(j->master_port, 20000 + 123456 % 20000);
  set("CHORUS_MASTER_ADDR", "override");
  EXPECT_EQ(readEnvJob()->master_addr, "override");
}

TEST_F(EnvTest, MalformedValuesNameTheVariable) {
  set("CHORUS_RANK", "two");
  set("CHORUS_WORLD_SIZE", "4");
  set("CHORUS_MASTER_ADDR", "h");
  set("CHORUS_MASTER_PORT", "1");
  auto j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_RANK='two'"), std::string::npos) << j.status().message();
  set("CHORUS_RANK", "4");
  j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_RANK=4"), std::string::npos) << j.status().message();
  set("CHORUS_RANK", "0");
  set("CHORUS_MASTER_PORT", "70000");
  j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_MASTER_PORT"), std::string::npos);
  set("CHORUS_MASTER_PORT", "1");
  unset("CHORUS_WORLD_SIZE");
  j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_WORLD_SIZE"), std::string::npos);
}

TEST_F(EnvTest, SecretFromHexAndRequired) {
  set("CHORUS_RANK", "0");
  set("CHORUS_WORLD_SIZE", "1");
  set("CHORUS_MASTER_ADDR", "10.9.8.7");  // not loopback: the ranks may be on several hosts
  set("CHORUS_MASTER_PORT", "1");
  set("CHORUS_REQUIRE_SECRET", "1");
  auto j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_SECRET"), std::string::npos);
  EXPECT_NE(j.status().message().find("several hosts"), std::string::npos) << j.status().message();
  auth::Secret s = auth::Secret::random();
  set("CHORUS_SECRET", s.toHex().c_str());
  j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_TRUE(j->secret.present);
  EXPECT_EQ(j->secret.bytes, s.bytes);
  set("CHORUS_SECRET", "nothex");
  j = readEnvJob();
  ASSERT_FALSE(j.isOk());
  EXPECT_NE(j.status().message().find("CHORUS_SECRET"), std::string::npos);
}

// Without CHORUS_SECRET, ranks that all run on this host share a per-job
// secret file; ranks that may be on several hosts get none and say why.
TEST_F(EnvTest, OneHostTorchrunGetsASecretWithoutTheUser) {
  set("RANK", "0");
  set("WORLD_SIZE", "4");
  set("LOCAL_WORLD_SIZE", "4");
  set("MASTER_ADDR", "node7");
  set("MASTER_PORT", "29500");
  set("TORCHELASTIC_RUN_ID", "none");
  set("CHORUS_REQUIRE_SECRET", "1");  // satisfied by the per-job file
  auto j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_TRUE(j->secret.present);
  EXPECT_NE(j->secret_origin.find("LOCAL_WORLD_SIZE == WORLD_SIZE"), std::string::npos) << j->secret_origin;
  ASSERT_FALSE(j->secret_file.empty());
  EXPECT_EQ(j->secret_file.rfind(secret_dir_.path, 0), 0u) << j->secret_file;
  struct stat st{};
  ASSERT_EQ(::stat(j->secret_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Several hosts: no file can serve them all.
  set("LOCAL_WORLD_SIZE", "2");
  unset("CHORUS_REQUIRE_SECRET");
  auto multi = readEnvJob();
  ASSERT_TRUE(multi.isOk()) << multi.status().message();
  EXPECT_FALSE(multi->secret.present);
  EXPECT_NE(multi->no_secret_reason.find("several hosts"), std::string::npos) << multi->no_secret_reason;
  // Open MPI on one host, and a loopback master, get one too.
  for (auto& [k, v] : std::map<std::string, std::string>{{"RANK", ""}, {"WORLD_SIZE", ""}}) unset(k.c_str());
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "3");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  set("OMPI_MCA_ess_base_jobid", "123");
  unset("MASTER_ADDR");
  unset("MASTER_PORT");
  auto ompi = readEnvJob();
  ASSERT_TRUE(ompi.isOk()) << ompi.status().message();
  EXPECT_TRUE(ompi->secret.present);
}

// Two ranks of one launch read the same secret; whoever comes first writes it.
TEST(JobSecretFile, TheFirstRankWritesAndTheOthersRead) {
  TempDir d;
  auto dir = privateSecretDir(d.path);
  ASSERT_TRUE(dir.isOk()) << dir.status().message();
  auto a = sharedJobSecret(*dir, "torchrun|none|node7|29501|4|0");
  auto b = sharedJobSecret(*dir, "torchrun|none|node7|29501|4|0");
  auto other = sharedJobSecret(*dir, "torchrun|none|node7|29502|4|0");
  ASSERT_TRUE(a.isOk() && b.isOk() && other.isOk());
  EXPECT_TRUE(a->created);
  EXPECT_FALSE(b->created);
  EXPECT_EQ(a->secret.bytes, b->secret.bytes);
  EXPECT_NE(a->secret.bytes, other->secret.bytes);
  EXPECT_EQ(a->path, b->path);
  EXPECT_NE(a->path, other->path);
  // Concurrent first arrivals agree too (link() decides the race).
  std::vector<std::array<std::byte, auth::kSecretBytes>> got(8);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < got.size(); ++i)
    ts.emplace_back([&, i] {
      auto r = sharedJobSecret(*dir, "race");
      EXPECT_TRUE(r.isOk()) << r.status().message();
      if (r.isOk()) got[i] = r->secret.bytes;
    });
  for (auto& t : ts) t.join();
  for (auto& g : got) EXPECT_EQ(g, got[0]);
}

// A file anyone else could have planted or read is refused, naming it.
TEST(JobSecretFile, RefusesFilesAndDirectoriesOthersCanTouch) {
  TempDir d;
  auto first = sharedJobSecret(d.path, "k");
  ASSERT_TRUE(first.isOk());
  ASSERT_EQ(::chmod(first->path.c_str(), 0644), 0);
  auto loose = sharedJobSecret(d.path, "k");
  ASSERT_FALSE(loose.isOk());
  EXPECT_NE(loose.status().message().find(first->path), std::string::npos) << loose.status().message();
  EXPECT_NE(loose.status().message().find("644"), std::string::npos) << loose.status().message();
  // A symlink in place of the file.
  auto target = sharedJobSecret(d.path, "target");
  ASSERT_TRUE(target.isOk());
  auto victim = sharedJobSecret(d.path, "victim");
  ASSERT_TRUE(victim.isOk());
  ASSERT_EQ(::unlink(victim->path.c_str()), 0);
  ASSERT_EQ(::symlink(target->path.c_str(), victim->path.c_str()), 0);
  EXPECT_FALSE(sharedJobSecret(d.path, "victim").isOk());
  // A directory others can enter.
  ASSERT_EQ(::chmod(d.path.c_str(), 0755), 0);
  auto open_dir = privateSecretDir(d.path);
  ASSERT_FALSE(open_dir.isOk());
  EXPECT_NE(open_dir.status().message().find("755"), std::string::npos) << open_dir.status().message();
  ASSERT_EQ(::chmod(d.path.c_str(), 0700), 0);
  // Another owner's file (as root, give it away; otherwise chown fails and
  // the mode check above stands in).
  auto owned = sharedJobSecret(d.path, "owned");
  ASSERT_TRUE(owned.isOk());
  if (::geteuid() == 0 && ::chown(owned->path.c_str(), 65534, 65534) == 0) {
    auto theirs = sharedJobSecret(d.path, "owned");
    ASSERT_FALSE(theirs.isOk());
    EXPECT_NE(theirs.status().message().find("uid 65534"), std::string::npos) << theirs.status().message();
  }
}

TEST_F(EnvTest, SecretFileOfTheUser) {
  set("CHORUS_RANK", "0");
  set("CHORUS_WORLD_SIZE", "2");
  set("CHORUS_MASTER_ADDR", "10.9.8.7");
  set("CHORUS_MASTER_PORT", "1");
  TempDir d;
  std::string path = d.path + "/s";
  auth::Secret s = auth::Secret::random();
  {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    std::string text = s.toHex() + "\n";
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  set("CHORUS_SECRET_FILE", path.c_str());
  auto j = readEnvJob();
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j->secret.bytes, s.bytes);
  EXPECT_TRUE(j->secret_file.empty());  // the user's file is never removed
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  auto loose = readEnvJob();
  ASSERT_FALSE(loose.isOk());
  EXPECT_NE(loose.status().message().find("chmod 600"), std::string::npos) << loose.status().message();
}

TEST(SlurmNodeList, FirstHost) {
  EXPECT_EQ(*firstSlurmHost("a,b"), "a");
  EXPECT_EQ(*firstSlurmHost("node[01-04,07]"), "node01");
  EXPECT_EQ(*firstSlurmHost("node[01-04,07],gpu3"), "node01");
  EXPECT_EQ(*firstSlurmHost("pre[3,5]-suf"), "pre3-suf");
  EXPECT_EQ(*firstSlurmHost("rack[2-3]-n[009-011]"), "rack2-n009");
  EXPECT_EQ(*firstSlurmHost("single"), "single");
  EXPECT_EQ(*firstSlurmHost("n[7]"), "n7");
  for (const char* bad : {"", ",a", "node[01-04", "node]1[", "n[]", "n[a-b]", "n[1-]", "n[[1]]"}) {
    auto r = firstSlurmHost(bad);
    EXPECT_FALSE(r.isOk()) << bad;
    if (!r.isOk()) {
      EXPECT_NE(r.status().message().find("SLURM_JOB_NODELIST"), std::string::npos);
    }
  }
}

TEST(HostIdentity, StableAndComparable) {
  HostIdentity a = localHostIdentity(""), b = localHostIdentity("");
  EXPECT_TRUE(a == b);
  // A host id (CHORUS_HOST_ID) makes a host of its own on the same machine.
  EXPECT_FALSE(localHostIdentity("h1") == a);
  EXPECT_TRUE(localHostIdentity("h1") == localHostIdentity("h1"));
  EXPECT_NE(a.hostname[0], '\0');
  EXPECT_NE(a.netns_inode, 0u);
  EXPECT_NE(a.ipcns_inode, 0u);
  EXPECT_EQ(std::strlen(a.boot_id), 36u);  // a UUID
  HostIdentity c = a;
  c.netns_inode += 1;
  EXPECT_FALSE(a == c);
  c = a;
  c.boot_id[0] = c.boot_id[0] == 'x' ? 'y' : 'x';
  EXPECT_FALSE(a == c);
}

}  // namespace
}  // namespace chorus::bootstrap
