// Per-job secret files (see job_secret.hpp).
#include "bootstrap/job_secret.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace chorus::bootstrap {
namespace {

constexpr size_t kFileBytes = 2 * auth::kSecretBytes + 1;  // hex digits and a newline

// SHA-256 of the key, the first 16 bytes in hex: a file name that says
// nothing about the job and cannot carry a path separator.
std::string keyName(const std::string& key) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(key.data(), key.size(), md, &len, EVP_sha256(), nullptr);
  std::string out = "job-";
  for (unsigned i = 0; i < 16 && i < len; ++i) out += fmt::format("{:02x}", md[i]);
  return out + ".secret";
}

// The file at fd is a regular file of ours that nobody else may read or write.
Status checkPrivateFile(int fd, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return errnoError(fmt::format("stat {}", path), errno);
  if (!S_ISREG(st.st_mode)) return invalidArgument("secret file {} is not a regular file", path);
  if (st.st_uid != ::geteuid())
    return invalidArgument("secret file {} belongs to uid {}, not to this user ({}): refusing it", path, st.st_uid,
                           ::geteuid());
  if ((st.st_mode & 077) != 0)
    return invalidArgument("secret file {} has mode {:o}: others may read or change it; `chmod 600 {}`", path,
                           st.st_mode & 0777, path);
  return {};
}

Result<auth::Secret> readOpen(int fd, const std::string& path) {
  CHORUS_RETURN_IF_ERROR(checkPrivateFile(fd, path));
  char buf[kFileBytes + 2];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0) return errnoError(fmt::format("read {}", path), errno);
  std::string_view text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  auto s = auth::Secret::fromHex(text);
  if (!s.isOk()) return s.status().withContext(fmt::format("secret file {}: ", path));
  return s;
}

}  // namespace

Result<std::string> privateSecretDir(const std::string& preferred) {
  std::string dir = preferred;
  if (dir.empty()) {
    dir = fmt::format("/tmp/chorus-{}", ::geteuid());
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errnoError(fmt::format("mkdir {}", dir), errno);
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) return errnoError(fmt::format("stat {}", dir), errno);
  if (!S_ISDIR(st.st_mode)) return invalidArgument("{} is not a directory (a symlink?): refusing it for job secrets", dir);
  if (st.st_uid != ::geteuid())
    return invalidArgument("{} belongs to uid {}, not to this user: refusing it for job secrets (someone else made it "
                           "first?)",
                           dir, st.st_uid);
  if ((st.st_mode & 077) != 0)
    return invalidArgument("{} has mode {:o}: others can enter it; refusing it for job secrets", dir,
                           st.st_mode & 0777);
  return dir;
}

Result<SharedSecret> sharedJobSecret(const std::string& dir, const std::string& job_key) {
  SharedSecret out;
  out.path = fmt::format("{}/{}", dir, keyName(job_key));
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = ::open(out.path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      auto s = readOpen(fd, out.path);
      ::close(fd);
      if (!s.isOk()) return s.status();
      out.secret = *s;
      return out;
    }
    if (errno != ENOENT) return errnoError(fmt::format("open {}", out.path), errno);
    // Not there: write ours under a name of our own, then link it into place.
    auth::Secret fresh = auth::Secret::random();
    if (!fresh.present) return systemError("cannot draw a job secret: the OS random generator failed");
    // A name of this writer's own: the process and a per-process count
    // (ranks as threads of one process write concurrently too).
    static std::atomic<uint64_t> writes{0};
    std::string tmp = fmt::format("{}.{}.{}.tmp", out.path, ::getpid(), writes.fetch_add(1));
    int w = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (w < 0) return errnoError(fmt::format("create {}", tmp), errno);
    std::string text = fresh.toHex() + "\n";
    bool wrote = ::write(w, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    int werr = errno;
    ::close(w);
    if (!wrote) {
      ::unlink(tmp.c_str());
      return errnoError(fmt::format("write {}", tmp), werr);
    }
    int linked = ::link(tmp.c_str(), out.path.c_str());
    int lerr = errno;
    ::unlink(tmp.c_str());
    if (linked == 0) {
      out.secret = fresh;
      out.created = true;
      return out;
    }
    if (lerr != EEXIST) return errnoError(fmt::format("link {}", out.path), lerr);
    // Another rank won the race: read its file (next attempt).
  }
  return internalError("job secret file {} appears and disappears (another job with the same key?)", out.path);
}

Result<auth::Secret> readSecretFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errnoError(fmt::format("CHORUS_SECRET_FILE={}", path), errno);
  auto s = readOpen(fd, path);
  ::close(fd);
  return s;
}

}  // namespace chorus::bootstrap
