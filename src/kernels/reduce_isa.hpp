// The reduction, scale and divide kernels, written once over GCC vector
// extensions and compiled once per ISA.
//
// NOT an ordinary header: reduce_isa_<isa>.cpp includes it inside
// `namespace chorus::kernels::isa_<isa> { ... }`, under a `#pragma GCC target`,
// after including <algorithm>, <array>, <bit>, <cstring>, <cstdint>, <immintrin.h> (x86; <emmintrin.h> for SSE2),
// convert.hpp, dispatch.hpp and reduce.hpp, and after defining:
//   CHORUS_VEC_BYTES   bytes of one vector register (16, 32, 64)
//   CHORUS_F16C_WIDTH  fp32 lanes of the F16C/AVX-512 half conversion to use (0 = none)
//   CHORUS_ISA_NAME    the table's name
//
// Why vector extensions rather than relying on the auto-vectoriser: dst may
// alias a or b, the build is -O2 (whose cheap cost model will not add alias
// checks), and fp16/bf16 need conversions the vectoriser does not find.  Each
// step loads whole vectors of a and b before storing to dst, so exact aliasing
// is safe.  Loads and stores go through memcpy, so no alignment is assumed.

template <class T>
struct VecOf {
  // A typedef, not an alias template: GCC drops vector_size on the latter.
  typedef T type __attribute__((vector_size(CHORUS_VEC_BYTES)));
};
template <class T>
using Vec = typename VecOf<T>::type;
template <class T>
inline constexpr size_t kLanes = CHORUS_VEC_BYTES / sizeof(T);
// The narrow (16-bit) storage of one fp32 vector.
using HalfVec = uint16_t __attribute__((vector_size(CHORUS_VEC_BYTES / 2)));

template <class V>
inline V ld(const unsigned char* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void st(unsigned char* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// Each op works on a scalar or a vector of the compute type.  Integer
// sum/prod are instantiated on the unsigned twin, so they wrap without UB.
struct Add {
  template <class V>
  static V apply(V a, V b) { return V(a + b); }
};
struct Mul {
  template <class V>
  static V apply(V a, V b) { return V(a * b); }
};
struct IntMax {
  template <class V>
  static V apply(V a, V b) { return a > b ? a : b; }
};
struct IntMin {
  template <class V>
  static V apply(V a, V b) { return a < b ? a : b; }
};
// NaN propagates: a if a is NaN or wins, else b (which may be the NaN).
struct FloatMax {
  template <class V>
  static V apply(V a, V b) { return ((a > b) | (a != a)) ? a : b; }
};
struct FloatMin {
  template <class V>
  static V apply(V a, V b) { return ((a < b) | (a != a)) ? a : b; }
};

// ---- types computed in themselves: integers, fp32, fp64 ----

template <class T, class Op>
void reduceDirect(void* dst, const void* a, const void* b, size_t n) {
  using V = Vec<T>;
  constexpr size_t L = kLanes<T>;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    const size_t o = i * sizeof(T);
    const V a0 = ld<V>(pa + o), a1 = ld<V>(pa + o + sizeof(V)), a2 = ld<V>(pa + o + 2 * sizeof(V)),
            a3 = ld<V>(pa + o + 3 * sizeof(V));
    const V b0 = ld<V>(pb + o), b1 = ld<V>(pb + o + sizeof(V)), b2 = ld<V>(pb + o + 2 * sizeof(V)),
            b3 = ld<V>(pb + o + 3 * sizeof(V));
    st(d + o, Op::apply(a0, b0));
    st(d + o + sizeof(V), Op::apply(a1, b1));
    st(d + o + 2 * sizeof(V), Op::apply(a2, b2));
    st(d + o + 3 * sizeof(V), Op::apply(a3, b3));
  }
  for (; i + L <= n; i += L) {
    const size_t o = i * sizeof(T);
    st(d + o, Op::apply(ld<V>(pa + o), ld<V>(pb + o)));
  }
  for (; i < n; ++i) {
    const size_t o = i * sizeof(T);
    st(d + o, Op::apply(ld<T>(pa + o), ld<T>(pb + o)));
  }
}

template <class T>
void scaleDirect(void* dst, const void* src, size_t n, const void* scalar) {
  using V = Vec<T>;
  constexpr size_t L = kLanes<T>;
  const T s = ld<T>(static_cast<const unsigned char*>(scalar));
  V sv;
  for (size_t k = 0; k < L; ++k) sv[k] = s;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  size_t i = 0;
  for (; i + L <= n; i += L) st(d + i * sizeof(T), V(ld<V>(p + i * sizeof(T)) * sv));
  for (; i < n; ++i) st(d + i * sizeof(T), T(ld<T>(p + i * sizeof(T)) * s));
}

template <class T>
void divideFloat(void* dst, const void* src, size_t n, uint64_t divisor) {
  using V = Vec<T>;
  constexpr size_t L = kLanes<T>;
  const T s = static_cast<T>(divisor);
  V sv;
  for (size_t k = 0; k < L; ++k) sv[k] = s;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  size_t i = 0;
  for (; i + L <= n; i += L) st(d + i * sizeof(T), V(ld<V>(p + i * sizeof(T)) / sv));
  for (; i < n; ++i) st(d + i * sizeof(T), T(ld<T>(p + i * sizeof(T)) / s));
}

// C division, truncating toward zero.  x86 has no SIMD integer divide, and
// Avg over integers is rare, so this stays scalar.
template <class T>
void divideInt(void* dst, const void* src, size_t n, uint64_t divisor) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    const T x = ld<T>(p + i * sizeof(T));
    T r;
    if constexpr (static_cast<T>(-1) < 0) {
      // |x| < 2^63 <= divisor gives 0, as C would with a wide enough type.
      r = divisor > static_cast<uint64_t>(INT64_MAX)
              ? T(0)
              : static_cast<T>(static_cast<int64_t>(x) / static_cast<int64_t>(divisor));
    } else {
      r = static_cast<T>(static_cast<uint64_t>(x) / divisor);
    }
    st(d + i * sizeof(T), r);
  }
}

// ---- narrow floats: widen to fp32, combine, round to nearest even ----

// convert::floatToBf16 lane-wise: the bf16 bits in the low half of each lane.
inline Vec<uint32_t> roundToBf16Bits(Vec<uint32_t> u) {
  return (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct Bf16Codec {
  using Storage = uint16_t;
  static constexpr bool kVector = true;
  static Vec<float> loadV(const unsigned char* p) {
    const Vec<uint32_t> w = __builtin_convertvector(ld<HalfVec>(p), Vec<uint32_t>) << 16;
    return (Vec<float>)w;  // a bit cast, as vector casts are
  }
  static void storeV(unsigned char* p, Vec<float> f) {
    st(p, __builtin_convertvector(roundToBf16Bits((Vec<uint32_t>)f), HalfVec));
  }
#if defined(__SSE2__)
  // Two fp32 vectors from one register of bf16, in a lane order of their own:
  // interleaving with zeros puts each bf16 in the top half of a 32-bit lane
  // (elements 0-3 and 4-7 of every 128-bit block), and a saturating pack of
  // the rounded results undoes exactly that permutation.  Elementwise ops
  // do not care about the order, and this avoids the cross-lane widening.
  static constexpr bool kPair = true;
#if CHORUS_VEC_BYTES == 64
  using Raw = __m512i;
  static Raw rawLoad(const unsigned char* p) { return _mm512_loadu_si512(p); }
  static Raw unpackLo(Raw x) { return _mm512_unpacklo_epi16(_mm512_setzero_si512(), x); }
  static Raw unpackHi(Raw x) { return _mm512_unpackhi_epi16(_mm512_setzero_si512(), x); }
  static void packStore(unsigned char* p, Raw lo, Raw hi) { _mm512_storeu_si512(p, _mm512_packus_epi32(lo, hi)); }
#elif CHORUS_VEC_BYTES == 32
  using Raw = __m256i;
  static Raw rawLoad(const unsigned char* p) { return _mm256_loadu_si256(reinterpret_cast<const Raw*>(p)); }
  static Raw unpackLo(Raw x) { return _mm256_unpacklo_epi16(_mm256_setzero_si256(), x); }
  static Raw unpackHi(Raw x) { return _mm256_unpackhi_epi16(_mm256_setzero_si256(), x); }
  static void packStore(unsigned char* p, Raw lo, Raw hi) {
    _mm256_storeu_si256(reinterpret_cast<Raw*>(p), _mm256_packus_epi32(lo, hi));
  }
#else
  using Raw = __m128i;
  static Raw rawLoad(const unsigned char* p) { return _mm_loadu_si128(reinterpret_cast<const Raw*>(p)); }
  static Raw unpackLo(Raw x) { return _mm_unpacklo_epi16(_mm_setzero_si128(), x); }
  static Raw unpackHi(Raw x) { return _mm_unpackhi_epi16(_mm_setzero_si128(), x); }
  // SSE2 has only the signed pack: bias into int16 range and back.
  static void packStore(unsigned char* p, Raw lo, Raw hi) {
    const Raw bias32 = _mm_set1_epi32(0x8000);
    const Raw packed = _mm_packs_epi32(_mm_sub_epi32(lo, bias32), _mm_sub_epi32(hi, bias32));
    _mm_storeu_si128(reinterpret_cast<Raw*>(p), _mm_xor_si128(packed, _mm_set1_epi16(static_cast<short>(0x8000))));
  }
#endif
  static_assert(sizeof(Raw) == sizeof(Vec<float>));
  static void loadPair(const unsigned char* p, Vec<float>& lo, Vec<float>& hi) {
    const Raw x = rawLoad(p);
    lo = (Vec<float>)unpackLo(x);
    hi = (Vec<float>)unpackHi(x);
  }
  static void storePair(unsigned char* p, Vec<float> lo, Vec<float> hi) {
    packStore(p, (Raw)roundToBf16Bits((Vec<uint32_t>)lo), (Raw)roundToBf16Bits((Vec<uint32_t>)hi));
  }
#else
  static constexpr bool kPair = false;
#endif
  static float load1(const unsigned char* p) { return convert::bf16ToFloat(ld<uint16_t>(p)); }
  static void store1(unsigned char* p, float f) { st(p, convert::floatToBf16(f)); }
};

struct Fp16Codec {
  using Storage = uint16_t;
#if CHORUS_F16C_WIDTH == 16
  static constexpr bool kVector = true;
  static_assert(kLanes<float> == 16);
  static Vec<float> loadV(const unsigned char* p) {
    return (Vec<float>)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void storeV(unsigned char* p, Vec<float> f) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph((__m512)f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#elif CHORUS_F16C_WIDTH == 8
  static constexpr bool kVector = true;
  static_assert(kLanes<float> == 8);
  static Vec<float> loadV(const unsigned char* p) {
    return (Vec<float>)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void storeV(unsigned char* p, Vec<float> f) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph((__m256)f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#else
  // No hardware conversion: the scalar bit-exact path (convert.hpp).
  static constexpr bool kVector = false;
  static Vec<float> loadV(const unsigned char*) { return Vec<float>{}; }
  static void storeV(unsigned char*, Vec<float>) {}
#endif
  static constexpr bool kPair = false;
  static float load1(const unsigned char* p) { return convert::halfToFloat(ld<uint16_t>(p)); }
  static void store1(unsigned char* p, float f) { st(p, convert::floatToHalf(f)); }
};

template <float (*kDecode)(uint8_t)>
inline constexpr std::array<float, 256> kFp8Table = [] {
  std::array<float, 256> t{};
  for (unsigned v = 0; v < 256; ++v) t[v] = kDecode(static_cast<uint8_t>(v));
  return t;
}();

// fp8 is scalar: decode by table, encode by convert.hpp's bit rules.
template <float (*kDecode)(uint8_t), uint8_t (*kEncode)(float)>
struct Fp8Codec {
  using Storage = uint8_t;
  static constexpr bool kVector = false;
  static Vec<float> loadV(const unsigned char*) { return Vec<float>{}; }
  static void storeV(unsigned char*, Vec<float>) {}
  static constexpr bool kPair = false;
  static float load1(const unsigned char* p) { return kFp8Table<kDecode>[*p]; }
  static void store1(unsigned char* p, float f) { *p = kEncode(f); }
};
using E4m3Codec = Fp8Codec<convert::fp8e4m3ToFloat, convert::floatToFp8e4m3>;
using E5m2Codec = Fp8Codec<convert::fp8e5m2ToFloat, convert::floatToFp8e5m2>;

template <class Codec, class Op>
void reduceNarrow(void* dst, const void* a, const void* b, size_t n) {
  constexpr size_t S = sizeof(typename Codec::Storage);
  constexpr size_t L = kLanes<float>;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  size_t i = 0;
  if constexpr (Codec::kVector) {
    for (; i + 2 * L <= n; i += 2 * L) {
      const size_t o = i * S;
      Vec<float> a0, a1, b0, b1;
      if constexpr (Codec::kPair) {
        Codec::loadPair(pa + o, a0, a1);
        Codec::loadPair(pb + o, b0, b1);
        Codec::storePair(d + o, Op::apply(a0, b0), Op::apply(a1, b1));
      } else {
        a0 = Codec::loadV(pa + o), a1 = Codec::loadV(pa + o + L * S);
        b0 = Codec::loadV(pb + o), b1 = Codec::loadV(pb + o + L * S);
        Codec::storeV(d + o, Op::apply(a0, b0));
        Codec::storeV(d + o + L * S, Op::apply(a1, b1));
      }
    }
    for (; i + L <= n; i += L) {
      const size_t o = i * S;
      Codec::storeV(d + o, Op::apply(Codec::loadV(pa + o), Codec::loadV(pb + o)));
    }
  }
  for (; i < n; ++i) Codec::store1(d + i * S, Op::apply(Codec::load1(pa + i * S), Codec::load1(pb + i * S)));
}

template <class Codec>
void scaleNarrow(void* dst, const void* src, size_t n, const void* scalar) {
  constexpr size_t S = sizeof(typename Codec::Storage);
  constexpr size_t L = kLanes<float>;
  const float s = Codec::load1(static_cast<const unsigned char*>(scalar));
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  size_t i = 0;
  if constexpr (Codec::kVector) {
    Vec<float> sv;
    for (size_t k = 0; k < L; ++k) sv[k] = s;
    for (; i + L <= n; i += L) Codec::storeV(d + i * S, Codec::loadV(p + i * S) * sv);
  }
  for (; i < n; ++i) Codec::store1(d + i * S, Codec::load1(p + i * S) * s);
}

template <class Codec>
void divideNarrow(void* dst, const void* src, size_t n, uint64_t divisor) {
  constexpr size_t S = sizeof(typename Codec::Storage);
  constexpr size_t L = kLanes<float>;
  const float s = static_cast<float>(divisor);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  size_t i = 0;
  if constexpr (Codec::kVector) {
    Vec<float> sv;
    for (size_t k = 0; k < L; ++k) sv[k] = s;
    for (; i + L <= n; i += L) Codec::storeV(d + i * S, Codec::loadV(p + i * S) / sv);
  }
  for (; i < n; ++i) Codec::store1(d + i * S, Codec::load1(p + i * S) / s);
}

// ---- CHORUS_REPRODUCIBLE=exact: float32 <-> one int64 word (dispatch.hpp) ----
//
// A word is an integer below 2^62, wider than a double's 53 bits, so both
// ways split it at bit 32 into two halves that a double holds exactly, and
// convert each with the magic number (add 2^52 + 2^51: the double's low
// mantissa bits are then the integer; no int64 <-> double instruction is
// needed, which AVX2 lacks).
//  * float -> word: d = x 2^-lsb is exact (a power-of-two scaling); its high
//    half h = d 2^-32 rounded to an integer, its low half d - h 2^32 (exact:
//    at most 2^31 in magnitude, an integer when no bit of x lies below
//    2^lsb).  Word = h 2^32 + low.
//  * word -> float: high and low halves to doubles (exact), added (one
//    rounding to 53 bits, its error recovered exactly by Fast2Sum: |high
//    part| >= 2^32 > low, or the high part is 0), and the sum made
//    round-to-odd (an inexact sum with an even last bit takes its odd
//    neighbour on the exact value's side).  Rounding that to float (24 bits,
//    53 >= 24 + 2) gives the correctly rounded sum: no double-rounding error.
// A word of 2^62 or more, a bit below 2^lsb, an infinity or a NaN is "not
// representable": the caller's general loop redoes the call.

// L 32-bit lanes, one per 64-bit lane of a full vector.
typedef uint32_t ExactU32 __attribute__((vector_size(CHORUS_VEC_BYTES / 2)));
typedef float ExactF32 __attribute__((vector_size(CHORUS_VEC_BYTES / 2)));

inline double exactPow2(int k) { return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52); }
inline constexpr int64_t kExactMagicBits = 0x4338000000000000;  // the bits of 2^52 + 2^51
inline constexpr double kExactMagic = 6755399441055744.0;        // 2^52 + 2^51
inline constexpr double kExactWordLimit = 4611686018427387904.0; // 2^62
inline constexpr double kExactHalf = 4294967296.0;               // 2^32: where a word splits
inline constexpr double kExactHalfInv = 1.0 / 4294967296.0;

// One element of exactToWord; true when it is not representable.
inline bool exactToWord1(int64_t* acc, float x, double scale) {
  const double d = static_cast<double>(x) * scale;
  const double th = d * kExactHalfInv + kExactMagic;
  const double lo = d - (th - kExactMagic) * kExactHalf;
  const double tl = lo + kExactMagic;
  const uint64_t hi_w = static_cast<uint64_t>(std::bit_cast<int64_t>(th) - kExactMagicBits) << 32;
  *acc = static_cast<int64_t>(hi_w + static_cast<uint64_t>(std::bit_cast<int64_t>(tl) - kExactMagicBits));
  return !(tl - kExactMagic == lo && d < kExactWordLimit && d > -kExactWordLimit);
}

#if defined(CHORUS_ISA_AVX512DQ)
// AVX-512DQ converts between int64 and double directly, so neither way needs
// the split: float -> word is d = x 2^-lsb truncated to an integer, which is
// exact, and representable when converting it back gives d again and
// |d| < 2^62; word -> float rounds the word toward zero to 53 bits and sets
// the last bit when that was inexact (round to odd), then scales and rounds
// once to float, as above.
inline bool exactToWordDq(int64_t* acc, const float* x, size_t n, double scale, size_t* done) {
  const __m512d sc = _mm512_set1_pd(scale), lim = _mm512_set1_pd(kExactWordLimit);
  const __m512d sign = _mm512_set1_pd(-0.0);
  __mmask8 bad = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d d = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)), sc);
    const __m512i w = _mm512_cvttpd_epi64(d);
    bad |= _mm512_cmp_pd_mask(_mm512_cvtepi64_pd(w), d, _CMP_NEQ_UQ);
    bad |= _mm512_cmp_pd_mask(_mm512_andnot_pd(sign, d), lim, _CMP_NLT_UQ);
    _mm512_storeu_si512(acc + i, w);
  }
  *done = i;
  return bad == 0;
}
inline bool exactFromWordDq(float* y, const int64_t* acc, size_t n, double scale, int64_t lim, size_t* done) {
  const __m512d sc = _mm512_set1_pd(scale);
  const __m512i hi = _mm512_set1_epi64(lim), lo = _mm512_set1_epi64(-lim), one = _mm512_set1_epi64(1);
  __mmask8 bad = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i w = _mm512_loadu_si512(acc + i);
    bad |= _mm512_cmpge_epi64_mask(w, hi) | _mm512_cmple_epi64_mask(w, lo);
    const __m512d t = _mm512_cvt_roundepi64_pd(w, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask8 inexact = _mm512_cmpneq_epi64_mask(_mm512_cvttpd_epi64(t), w);
    const __m512d odd = _mm512_castsi512_pd(_mm512_mask_or_epi64(_mm512_castpd_si512(t), inexact,
                                                                 _mm512_castpd_si512(t), one));
    _mm256_storeu_ps(y + i, _mm512_cvtpd_ps(_mm512_mul_pd(odd, sc)));
  }
  *done = i;
  return bad == 0;
}
#endif

bool exactToWord(int64_t* acc, const float* x, size_t n, int lsb_exp) {
  using I = Vec<int64_t>;
  using U = Vec<uint64_t>;
  using D = Vec<double>;
  constexpr size_t L = kLanes<int64_t>;
  if (lsb_exp < -1023 || lsb_exp > 1022) return false;  // 2^-lsb is no normal double
  const double scale = exactPow2(-lsb_exp);
  I bad = {};
  size_t i = 0;
#if defined(CHORUS_ISA_AVX512DQ)
  if (!exactToWordDq(acc, x, n, scale, &i)) return false;
#endif
  for (; i + L <= n; i += L) {
    ExactF32 f;
    std::memcpy(&f, x + i, sizeof f);
    const D d = __builtin_convertvector(f, D) * scale;
    const D th = d * kExactHalfInv + kExactMagic;
    const D lo = d - (th - kExactMagic) * kExactHalf;
    const D tl = lo + kExactMagic;
    // NaN fails the first test (its low half is NaN), an infinity too.
    bad |= ((tl - kExactMagic) != lo) | (d >= kExactWordLimit) | (d <= -kExactWordLimit);
    const U w = ((U)((I)th - kExactMagicBits) << 32) + (U)((I)tl - kExactMagicBits);
    st(reinterpret_cast<unsigned char*>(acc + i), (I)w);
  }
  bool any = false;
  for (size_t k = 0; k < L; ++k) any |= bad[k] != 0;
  for (; i < n; ++i) any |= exactToWord1(acc + i, x[i], scale);
  return !any;
}

// One element of exactFromWord (|w| < 2^62).
inline float exactFromWord1(int64_t w, double scale) {
  const double big = static_cast<double>(w >> 32) * kExactHalf;  // exact: |w >> 32| < 2^30
  const double low = static_cast<double>(w & 0xffffffff);
  const double s = big + low;
  const double err = low - (s - big);
  int64_t b = std::bit_cast<int64_t>(s);
  if (err != 0 && (b & 1) == 0) b += (err > 0) == (s > 0) ? 1 : -1;
  return static_cast<float>(std::bit_cast<double>(b) * scale);
}

bool exactFromWord(float* y, const int64_t* acc, size_t n, int lsb_exp, int64_t lim) {
  using I = Vec<int64_t>;
  using D = Vec<double>;
  constexpr size_t L = kLanes<int64_t>;
  const double scale = exactPow2(lsb_exp);
  I bad = {};
  size_t i = 0;
#if defined(CHORUS_ISA_AVX512DQ)
  if (!exactFromWordDq(y, acc, n, scale, lim, &i)) return false;
#endif
  for (; i + L <= n; i += L) {
    const I w = ld<I>(reinterpret_cast<const unsigned char*>(acc + i));
    bad |= (w >= lim) | (w <= -lim);
    const D big = ((D)((w >> 32) + kExactMagicBits) - kExactMagic) * kExactHalf;
    const D low = (D)((w & 0xffffffff) + kExactMagicBits) - kExactMagic;
    const D s = big + low;
    const D err = low - (s - big);
    // Round to odd: +1 or -1 on the bits (away from or toward zero) where
    // the sum is inexact and its last bit even.
    const I fix = (err != 0) & (((I)s & 1) == 0);
    const I dir = (((err > 0) == (s > 0)) & 2) - 1;
    const D odd = (D)((I)s + (fix & dir));
    const ExactF32 f = __builtin_convertvector(odd * scale, ExactF32);
    std::memcpy(y + i, &f, sizeof f);
  }
  bool any = false;
  for (size_t k = 0; k < L; ++k) any |= bad[k] != 0;
  for (; i < n; ++i) {
    const int64_t w = acc[i];
    any |= w >= lim || w <= -lim;
    y[i] = exactFromWord1(w, scale);
  }
  return !any;
}

void exactRangeFloat(const float* x, size_t n, uint32_t* max_e, uint32_t* min_e) {
  using U = Vec<uint32_t>;
  constexpr size_t L = kLanes<uint32_t>;
  U mx = {}, mn = {};
  mn += 256;
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const U b = ld<U>(reinterpret_cast<const unsigned char*>(x + i));
    const U e = (b >> 23) & 0xff;
    const auto fin_nz = ((b & 0x7fffffff) != 0) & (e != 0xff);
    const U ef = e == 0 ? U{} + 1 : e;
    const U hi = fin_nz ? ef : U{}, lo = fin_nz ? ef : U{} + 256;
    mx = mx > hi ? mx : hi;
    mn = mn < lo ? mn : lo;
  }
  uint32_t a = 0, z = 256;
  for (size_t k = 0; k < L; ++k) a = std::max(a, mx[k]), z = std::min(z, mn[k]);
  for (; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]);
    const uint32_t e = (b >> 23) & 0xff;
    if ((b & 0x7fffffff) == 0 || e == 0xff) continue;
    a = std::max(a, e == 0 ? 1u : e);
    z = std::min(z, e == 0 ? 1u : e);
  }
  *max_e = a;
  *min_e = z;
}

// ---- the table, in chorusDataType_t order x BinOp order ----

// ---- MoE combine's accumulators (dispatch.hpp, FloatAccumFns) ----

inline Vec<float> splat(float s) {
  Vec<float> v;
  for (size_t k = 0; k < kLanes<float>; ++k) v[k] = s;
  return v;
}

void accumulateF32(float* acc, const float* x, size_t n, float w) {
  constexpr size_t L = kLanes<float>;
  auto* d = reinterpret_cast<unsigned char*>(acc);
  const auto* p = reinterpret_cast<const unsigned char*>(x);
  const Vec<float> wv = splat(w);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const Vec<float> prod = wv * ld<Vec<float>>(p + i * 4);
    st(d + i * 4, ld<Vec<float>>(d + i * 4) + prod);
  }
  for (; i < n; ++i) {
    const float prod = w * x[i];
    acc[i] = acc[i] + prod;
  }
}

void accumulateBf16(float* acc, const uint16_t* x, size_t n, float w) {
  constexpr size_t L = kLanes<float>;
  auto* d = reinterpret_cast<unsigned char*>(acc);
  const auto* p = reinterpret_cast<const unsigned char*>(x);
  const Vec<float> wv = splat(w);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const Vec<float> prod = wv * Bf16Codec::loadV(p + i * 2);
    st(d + i * 4, ld<Vec<float>>(d + i * 4) + prod);
  }
  for (; i < n; ++i) {
    const float prod = w * convert::bf16ToFloat(x[i]);
    acc[i] = acc[i] + prod;
  }
}

void bf16ToFloatArray(float* dst, const uint16_t* src, size_t n) {
  constexpr size_t L = kLanes<float>;
  size_t i = 0;
  for (; i + L <= n; i += L)
    st(reinterpret_cast<unsigned char*>(dst + i), Bf16Codec::loadV(reinterpret_cast<const unsigned char*>(src + i)));
  for (; i < n; ++i) dst[i] = convert::bf16ToFloat(src[i]);
}

void floatToBf16Array(uint16_t* dst, const float* src, size_t n) {
  constexpr size_t L = kLanes<float>;
  size_t i = 0;
  for (; i + L <= n; i += L)
    Bf16Codec::storeV(reinterpret_cast<unsigned char*>(dst + i), ld<Vec<float>>(reinterpret_cast<const unsigned char*>(src + i)));
  for (; i < n; ++i) dst[i] = convert::floatToBf16(src[i]);
}

#define CHORUS_INT_ROW(S, U) \
  { &reduceDirect<U, Add>, &reduceDirect<U, Mul>, &reduceDirect<S, IntMax>, &reduceDirect<S, IntMin> }
#define CHORUS_FLOAT_ROW(T) \
  { &reduceDirect<T, Add>, &reduceDirect<T, Mul>, &reduceDirect<T, FloatMax>, &reduceDirect<T, FloatMin> }
#define CHORUS_NARROW_ROW(C) \
  { &reduceNarrow<C, Add>, &reduceNarrow<C, Mul>, &reduceNarrow<C, FloatMax>, &reduceNarrow<C, FloatMin> }

static_assert(chorusInt8 == 0 && chorusUint8 == 1 && chorusInt32 == 2 && chorusUint32 == 3 && chorusInt64 == 4 &&
              chorusUint64 == 5 && chorusFloat16 == 6 && chorusFloat32 == 7 && chorusFloat64 == 8 &&
              chorusBfloat16 == 9 && chorusFloat8e4m3 == 10 && chorusFloat8e5m2 == 11 && chorusNumTypes == 12);
static_assert(static_cast<int>(BinOp::Sum) == 0 && static_cast<int>(BinOp::Prod) == 1 &&
              static_cast<int>(BinOp::Max) == 2 && static_cast<int>(BinOp::Min) == 3);

inline constexpr KernelTable kTable = {
    CHORUS_ISA_NAME,
    {
        CHORUS_INT_ROW(int8_t, uint8_t),
        CHORUS_INT_ROW(uint8_t, uint8_t),
        CHORUS_INT_ROW(int32_t, uint32_t),
        CHORUS_INT_ROW(uint32_t, uint32_t),
        CHORUS_INT_ROW(int64_t, uint64_t),
        CHORUS_INT_ROW(uint64_t, uint64_t),
        CHORUS_NARROW_ROW(Fp16Codec),
        CHORUS_FLOAT_ROW(float),
        CHORUS_FLOAT_ROW(double),
        CHORUS_NARROW_ROW(Bf16Codec),
        CHORUS_NARROW_ROW(E4m3Codec),
        CHORUS_NARROW_ROW(E5m2Codec),
    },
    {
        &scaleDirect<uint8_t>, &scaleDirect<uint8_t>, &scaleDirect<uint32_t>, &scaleDirect<uint32_t>,
        &scaleDirect<uint64_t>, &scaleDirect<uint64_t>, &scaleNarrow<Fp16Codec>, &scaleDirect<float>,
        &scaleDirect<double>, &scaleNarrow<Bf16Codec>, &scaleNarrow<E4m3Codec>, &scaleNarrow<E5m2Codec>,
    },
    {
        &divideInt<int8_t>, &divideInt<uint8_t>, &divideInt<int32_t>, &divideInt<uint32_t>,
        &divideInt<int64_t>, &divideInt<uint64_t>, &divideNarrow<Fp16Codec>, &divideFloat<float>,
        &divideFloat<double>, &divideNarrow<Bf16Codec>, &divideNarrow<E4m3Codec>, &divideNarrow<E5m2Codec>,
    },
    {&exactToWord, &exactFromWord, &exactRangeFloat},
    {&accumulateF32, &accumulateBf16, &bf16ToFloatArray, &floatToBf16Array},
};

#undef CHORUS_INT_ROW
#undef CHORUS_FLOAT_ROW
#undef CHORUS_NARROW_ROW

const KernelTable& table() { return kTable; }
