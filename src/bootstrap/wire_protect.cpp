// The record layer of CHORUS_WIRE_PROTECT (wire_protect.hpp has the format).
#include "bootstrap/wire_protect.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace chorus::auth {

Result<WireProtect> parseWireProtect(std::string_view text) {
  if (text == "off") return WireProtect::kOff;
  if (text == "mac") return WireProtect::kMac;
  if (text == "encrypt") return WireProtect::kEncrypt;
  return invalidArgument("wire protection '{}' is none of off, mac, encrypt", text);
}

std::string_view wireProtectName(WireProtect p) {
  switch (p) {
    case WireProtect::kOff: return "off";
    case WireProtect::kMac: return "mac";
    case WireProtect::kEncrypt: return "encrypt";
  }
  return "?";
}

namespace {

std::array<std::byte, 32> hkdf(const Secret& secret, std::span<const std::byte> salt, std::string_view info) {
  std::array<std::byte, 32> out{};
  std::array<std::byte, kSecretBytes> key{};
  if (secret.present) key = secret.bytes;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t len = out.size();
  bool ok = ctx != nullptr && EVP_PKEY_derive_init(ctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0 &&
            EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(salt.data()),
                                        static_cast<int>(salt.size())) > 0 &&
            EVP_PKEY_CTX_set1_hkdf_key(ctx, reinterpret_cast<const unsigned char*>(key.data()),
                                       static_cast<int>(key.size())) > 0 &&
            EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(info.data()),
                                        static_cast<int>(info.size())) > 0 &&
            EVP_PKEY_derive(ctx, reinterpret_cast<unsigned char*>(out.data()), &len) > 0 && len == out.size();
  EVP_PKEY_CTX_free(ctx);
  OPENSSL_cleanse(key.data(), key.size());
  // A libcrypto failure: keys the peer cannot share, so every record fails
  // closed instead of going out under a predictable key.
  if (!ok)
    for (auto& b : out) b = static_cast<std::byte>(std::rand());
  return out;
}

void putLe32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint32_t loadLe32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | std::to_integer<uint32_t>(p[i]);
  return v;
}

}  // namespace

SessionKeys deriveSessionKeys(const Secret& secret, std::span<const std::byte> nonce_c,
                              std::span<const std::byte> nonce_s, bool client) {
  std::vector<std::byte> salt(nonce_c.begin(), nonce_c.end());
  salt.insert(salt.end(), nonce_s.begin(), nonce_s.end());
  SessionKeys k;
  auto c2s = hkdf(secret, salt, "chorus wire v1 c2s");
  auto s2c = hkdf(secret, salt, "chorus wire v1 s2c");
  k.send = client ? c2s : s2c;
  k.recv = client ? s2c : c2s;
  k.valid = true;
  OPENSSL_cleanse(c2s.data(), c2s.size());
  OPENSSL_cleanse(s2c.data(), s2c.size());
  return k;
}

SessionKeys deriveMessageKeys(const Secret& secret, std::span<const std::byte> nonce_a,
                              std::span<const std::byte> nonce_b, std::span<const std::byte> context, bool a) {
  std::vector<std::byte> salt(nonce_a.begin(), nonce_a.end());
  salt.insert(salt.end(), nonce_b.begin(), nonce_b.end());
  const std::string ctx(reinterpret_cast<const char*>(context.data()), context.size());
  auto a2b = hkdf(secret, salt, "chorus wire v1 msg a2b " + ctx);
  auto b2a = hkdf(secret, salt, "chorus wire v1 msg b2a " + ctx);
  SessionKeys k;
  k.send = a ? a2b : b2a;
  k.recv = a ? b2a : a2b;
  k.valid = true;
  OPENSSL_cleanse(a2b.data(), a2b.size());
  OPENSSL_cleanse(b2a.data(), b2a.size());
  return k;
}

// ---------------------------------------------------------------- MessageSealer

struct MessageSealer::Ctx {
  EVP_CIPHER_CTX* c = nullptr;
  bool ok = false;
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

namespace {

std::array<unsigned char, 12> messageIv(uint32_t stream, uint64_t seq) {
  std::array<unsigned char, 12> v{};
  for (int i = 0; i < 8; ++i) v[static_cast<size_t>(i)] = static_cast<unsigned char>(seq >> (8 * i));
  for (int i = 0; i < 4; ++i) v[static_cast<size_t>(8 + i)] = static_cast<unsigned char>(stream >> (8 * i));
  return v;
}

// EVP takes int lengths: big spans go in pieces.
constexpr size_t kEvpPiece = size_t{1} << 30;

bool aad(EVP_CIPHER_CTX* c, std::span<const std::byte> b, bool encrypt) {
  int outl = 0;
  for (size_t at = 0; at < b.size(); at += kEvpPiece) {
    const size_t n = std::min(kEvpPiece, b.size() - at);
    const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
    if ((encrypt ? EVP_EncryptUpdate(c, nullptr, &outl, p, static_cast<int>(n))
                 : EVP_DecryptUpdate(c, nullptr, &outl, p, static_cast<int>(n))) != 1)
      return false;
  }
  return true;
}

bool crypt(EVP_CIPHER_CTX* c, std::span<const std::byte> in, std::byte* out, bool encrypt) {
  int outl = 0;
  for (size_t at = 0; at < in.size(); at += kEvpPiece) {
    const size_t n = std::min(kEvpPiece, in.size() - at);
    const auto* p = reinterpret_cast<const unsigned char*>(in.data() + at);
    auto* o = reinterpret_cast<unsigned char*>(out + at);
    if ((encrypt ? EVP_EncryptUpdate(c, o, &outl, p, static_cast<int>(n))
                 : EVP_DecryptUpdate(c, o, &outl, p, static_cast<int>(n))) != 1 ||
        static_cast<size_t>(outl) != n)
      return false;
  }
  return true;
}

}  // namespace

MessageSealer::MessageSealer(WireProtect mode, const std::array<std::byte, 32>& key, bool sealing)
    : mode_(mode), sealing_(sealing), ctx_(std::make_unique<Ctx>()) {
  ctx_->c = EVP_CIPHER_CTX_new();
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  ctx_->ok = ctx_->c != nullptr && (sealing ? EVP_EncryptInit_ex(ctx_->c, EVP_aes_256_gcm(), nullptr, k, nullptr)
                                            : EVP_DecryptInit_ex(ctx_->c, EVP_aes_256_gcm(), nullptr, k, nullptr)) == 1;
}

MessageSealer::~MessageSealer() = default;

bool MessageSealer::seal(uint32_t stream, uint64_t seq, std::span<const std::byte> clear,
                         std::span<const std::byte> body, std::byte* body_out, std::byte* tag) {
  if (!sealing_ || !ctx_->ok || body.size() > kMaxBody) return false;
  EVP_CIPHER_CTX* c = ctx_->c;
  const auto iv = messageIv(stream, seq);
  int outl = 0;
  bool ok = EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) == 1 && aad(c, clear, true);
  if (mode_ == WireProtect::kEncrypt)
    ok = ok && (body.empty() || crypt(c, body, body_out, true));
  else
    ok = ok && aad(c, body, true);
  unsigned char last[16];
  return ok && EVP_EncryptFinal_ex(c, last, &outl) == 1 && outl == 0 &&
         EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes), tag) == 1;
}

bool MessageSealer::open(uint32_t stream, uint64_t seq, std::span<const std::byte> clear,
                         std::span<const std::byte> body, std::byte* body_out, const std::byte* tag) {
  const bool enc = mode_ == WireProtect::kEncrypt;
  auto fail = [&] {
    if (enc && body_out != nullptr && !body.empty()) OPENSSL_cleanse(body_out, body.size());
    return false;
  };
  if (sealing_ || !ctx_->ok || body.size() > kMaxBody) return fail();
  EVP_CIPHER_CTX* c = ctx_->c;
  const auto iv = messageIv(stream, seq);
  std::array<std::byte, kTagBytes> t{};
  std::memcpy(t.data(), tag, kTagBytes);
  int outl = 0;
  bool ok = EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) == 1 && aad(c, clear, false);
  if (enc)
    ok = ok && (body.empty() || crypt(c, body, body_out, false));
  else
    ok = ok && aad(c, body, false);
  unsigned char last[16];
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagBytes), t.data()) == 1 &&
       EVP_DecryptFinal_ex(c, last, &outl) == 1;
  return ok ? true : fail();
}

// ---------------------------------------------------------------- SealedStream

struct SealedStream::Cipher {
  EVP_CIPHER_CTX* ctx = nullptr;
  bool ok = false;
  Cipher(const std::array<std::byte, 32>& key, bool encrypt) {
    ctx = EVP_CIPHER_CTX_new();
    const auto* k = reinterpret_cast<const unsigned char*>(key.data());
    ok = ctx != nullptr && (encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, k, nullptr)
                                    : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, k, nullptr)) == 1;
  }
  ~Cipher() { EVP_CIPHER_CTX_free(ctx); }
  static std::array<unsigned char, 12> iv(uint64_t seq) {
    std::array<unsigned char, 12> v{};
    for (int i = 0; i < 8; ++i) v[static_cast<size_t>(i)] = static_cast<unsigned char>(seq >> (8 * i));
    return v;
  }
};

SealedStream::SealedStream(WireProtect mode, const SessionKeys& keys)
    : mode_(mode), tx_(std::make_unique<Cipher>(keys.send, true)), rx_(std::make_unique<Cipher>(keys.recv, false)) {
  in_.resize(2 * (kMaxRecord + kOverhead));
  plain_.resize(kMaxRecord);
}

SealedStream::~SealedStream() = default;

bool SealedStream::seal(const iovec* iov, int cnt, size_t skip, size_t take) {
  const size_t start = out_.size();
  out_.resize(start + 4 + take + 16);
  std::byte* rec = out_.data() + start;
  putLe32(rec, static_cast<uint32_t>(take));
  EVP_CIPHER_CTX* c = tx_->ctx;
  auto iv = Cipher::iv(send_seq_++);
  int outl = 0;
  bool ok = tx_->ok && EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            EVP_EncryptUpdate(c, nullptr, &outl, reinterpret_cast<const unsigned char*>(rec), 4) == 1;
  auto* body = reinterpret_cast<unsigned char*>(rec + 4);
  size_t at = 0;
  for (int i = 0; i < cnt && at < take && ok; ++i) {
    size_t len = iov[i].iov_len;
    if (skip >= len) {
      skip -= len;
      continue;
    }
    const auto* src = static_cast<const unsigned char*>(iov[i].iov_base) + skip;
    size_t n = std::min(len - skip, take - at);
    skip = 0;
    if (mode_ == WireProtect::kEncrypt) {
      ok = EVP_EncryptUpdate(c, body + at, &outl, src, static_cast<int>(n)) == 1 && static_cast<size_t>(outl) == n;
    } else {
      std::memcpy(body + at, src, n);
      ok = EVP_EncryptUpdate(c, nullptr, &outl, src, static_cast<int>(n)) == 1;
    }
    at += n;
  }
  ok = ok && at == take && EVP_EncryptFinal_ex(c, body + take, &outl) == 1 &&
       EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, body + take) == 1;
  if (!ok) {
    out_.resize(start);
    return false;
  }
  return true;
}

int SealedStream::flush(int fd) {
  while (out_off_ < out_.size()) {
    ssize_t n = ::send(fd, out_.data() + out_off_, out_.size() - out_off_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      out_off_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  out_.clear();
  out_off_ = 0;
  return 1;
}

ssize_t SealedStream::writev(int fd, const iovec* iov, int cnt) {
  if (outPending()) {
    int f = flush(fd);
    if (f < 0) return -1;
    if (f == 0) {
      errno = EAGAIN;
      return -1;
    }
  }
  size_t total = 0;
  for (int i = 0; i < cnt; ++i) total += iov[i].iov_len;
  size_t taken = 0;
  while (taken < total) {
    size_t take = std::min(kMaxRecord, total - taken);
    if (!seal(iov, cnt, taken, take)) {
      errno = EIO;
      return -1;
    }
    taken += take;
    int f = flush(fd);
    if (f < 0) return -1;
    if (f == 0) break;  // the socket is full: what is sealed goes out later
  }
  return static_cast<ssize_t>(taken);
}

bool SealedStream::inBuffered() const {
  if (plain_len_ > 0 || broken_) return true;
  if (in_len_ < 4) return false;
  uint32_t len = loadLe32(in_.data() + in_off_);
  return len == 0 || len > kMaxRecord || in_len_ >= 4 + size_t{len} + 16;
}

int SealedStream::fill(int fd) {
  if (in_off_ > 0 && in_off_ + in_len_ > in_.size() / 2) {
    std::memmove(in_.data(), in_.data() + in_off_, in_len_);
    in_off_ = 0;
  }
  size_t room = in_.size() - in_off_ - in_len_;
  if (room == 0) return 1;
  ssize_t n;
  do {
    n = ::recv(fd, in_.data() + in_off_ + in_len_, room, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  if (n == 0) return 0;
  in_len_ += static_cast<size_t>(n);
  return 1;
}

int SealedStream::openOne(std::byte* into) {
  if (in_len_ < 4) return 0;
  const std::byte* rec = in_.data() + in_off_;
  uint32_t len = loadLe32(rec);
  if (len == 0 || len > kMaxRecord) {
    broken_ = true;
    broken_errno_ = EPROTO;
    error_ = fmt::format("record #{} announces {} bytes, outside 1..{} (not a protected chorus stream?)", recv_seq_,
                         len, kMaxRecord);
    errno = EPROTO;
    return -1;
  }
  if (in_len_ < 4 + size_t{len} + 16) return 0;
  EVP_CIPHER_CTX* c = rx_->ctx;
  auto iv = Cipher::iv(recv_seq_);
  const auto* body = reinterpret_cast<const unsigned char*>(rec + 4);
  auto* tag = const_cast<unsigned char*>(body + len);
  auto* out = reinterpret_cast<unsigned char*>(into != nullptr ? into : plain_.data());
  int outl = 0;
  bool ok = rx_->ok && EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            EVP_DecryptUpdate(c, nullptr, &outl, reinterpret_cast<const unsigned char*>(rec), 4) == 1;
  if (mode_ == WireProtect::kEncrypt) {
    ok = ok && EVP_DecryptUpdate(c, out, &outl, body, static_cast<int>(len)) == 1;
  } else {
    ok = ok && EVP_DecryptUpdate(c, nullptr, &outl, body, static_cast<int>(len)) == 1;
    std::memcpy(out, body, len);
  }
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, 16, tag) == 1 && EVP_DecryptFinal_ex(c, out + len, &outl) == 1;
  if (!ok) {
    OPENSSL_cleanse(out, len);
    broken_ = true;
    broken_errno_ = EBADMSG;
    error_ = fmt::format("record #{} ({} bytes) failed its integrity check: changed, dropped, replayed or reordered "
                         "on the way, or sent under other keys",
                         recv_seq_, len);
    errno = EBADMSG;
    return -1;
  }
  ++recv_seq_;
  in_off_ += 4 + size_t{len} + 16;
  in_len_ -= 4 + size_t{len} + 16;
  if (in_len_ == 0) in_off_ = 0;
  plain_off_ = 0;
  plain_len_ = into != nullptr ? 0 : len;
  return 1;
}

size_t SealedStream::wholeRecord() const {
  if (in_len_ < 4) return 0;
  uint32_t len = loadLe32(in_.data() + in_off_);
  if (len == 0 || len > kMaxRecord || in_len_ < 4 + size_t{len} + 16) return 0;
  return len;
}

ssize_t SealedStream::readv(int fd, const iovec* iov, int cnt) {
  size_t asked = 0;
  for (int i = 0; i < cnt; ++i) asked += iov[i].iov_len;
  if (asked == 0) return 0;
  size_t copied = 0;
  int seg = 0;
  size_t seg_off = 0;
  for (;;) {
    while (plain_len_ > 0 && copied < asked) {
      while (seg_off == iov[seg].iov_len) {
        ++seg;
        seg_off = 0;
      }
      size_t n = std::min(plain_len_, iov[seg].iov_len - seg_off);
      std::memcpy(static_cast<std::byte*>(iov[seg].iov_base) + seg_off, plain_.data() + plain_off_, n);
      seg_off += n;
      plain_off_ += n;
      plain_len_ -= n;
      copied += n;
    }
    if (copied == asked) return static_cast<ssize_t>(copied);
    if (broken_) {
      if (copied > 0) return static_cast<ssize_t>(copied);
      errno = broken_errno_;
      return -1;
    }
    // A whole record that fits the caller's current buffer is opened straight
    // into it (one copy fewer); if its check fails, what it wrote is wiped
    // and the stream is broken, as for a record opened into plain_.
    std::byte* direct = nullptr;
    const size_t whole = wholeRecord();
    if (whole > 0) {
      while (seg_off == iov[seg].iov_len) {
        ++seg;
        seg_off = 0;
      }
      if (iov[seg].iov_len - seg_off >= whole) direct = static_cast<std::byte*>(iov[seg].iov_base) + seg_off;
    }
    int o = openOne(direct);
    if (o == 1 && direct != nullptr) {
      seg_off += whole;
      copied += whole;
      continue;
    }
    if (o == 1) continue;
    if (o < 0) {
      if (copied > 0) return static_cast<ssize_t>(copied);
      return -1;
    }
    if (copied > 0) return static_cast<ssize_t>(copied);
    if (eof_) {
      if (in_len_ == 0) return 0;
      broken_ = true;
      broken_errno_ = EPROTO;
      error_ = fmt::format("the stream ended inside record #{} ({} of its bytes arrived)", recv_seq_, in_len_);
      errno = EPROTO;
      return -1;
    }
    int f = fill(fd);
    if (f < 0) return -1;
    if (f == 0) eof_ = true;
  }
}

size_t SealedStream::peek(int fd, std::span<std::byte> out) {
  if (plain_len_ == 0 && !broken_) {
    if (openOne() == 0 && !eof_ && fill(fd) > 0) (void)openOne();
  }
  size_t n = std::min(out.size(), plain_len_);
  if (n > 0) std::memcpy(out.data(), plain_.data() + plain_off_, n);
  return n;
}

}  // namespace chorus::auth
