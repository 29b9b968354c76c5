#include "plan/verify.hpp"

#include <deque>
#include <map>
#include <unordered_map>

#include "plan/canonical.hpp"

namespace chorus::plan {
namespace {

struct Value {
  uint64_t ranks = 0;  // contributors; 0 = undefined
  uint64_t index = 0;  // element of the contributors' inputs
  bool poisoned = false;
  uint32_t tree = 0;   // the combination tree (Trees): a leaf is the rank's id
  // Compressed plans: the most times any contribution to this value was
  // quantized on its way here (a sum takes the larger of its operands').
  uint32_t quant = 0;
  // Shape::scaling: the ranks whose contribution was scaled by their
  // PreMulSum scalar, and how often the value was divided (Avg).
  uint64_t scaled = 0;
  uint32_t divided = 0;
  // Exact plans: the value is held as exact accumulator words (Encode made
  // it; only Decode turns it back into the call's type), and whether a
  // Decode rounded it (a rounded value may never be encoded again).
  bool word = false;
  bool rounded = false;
  bool operator==(const Value&) const = default;
};

// Combination trees, interned: ids 0..63 are the leaves (rank ids), every
// other id an unordered pair of ids (IEEE addition is commutative: only the
// association is recorded), so equal trees have equal ids.
class Trees {
 public:
  uint32_t node(uint32_t a, uint32_t b) {
    if (a > b) std::swap(a, b);
    const uint64_t key = uint64_t{a} << 32 | b;
    auto [it, fresh] = ids_.try_emplace(key, static_cast<uint32_t>(kLeaves + kids_.size()));
    if (fresh) {
      // Printed with the child holding the lowest rank first.
      if (lowest(b) < lowest(a)) std::swap(a, b);
      kids_.push_back({a, b});
    }
    return it->second;
  }
  // The canonical tree over ranks [lo, hi) (canonical.hpp).
  uint32_t canonical(int lo, int hi) {
    if (hi - lo == 1) return static_cast<uint32_t>(lo);
    const int mid = canonicalSplit(lo, hi);
    return node(canonical(lo, mid), canonical(mid, hi));
  }
  uint32_t lowest(uint32_t t) const { return t < kLeaves ? t : lowest(kids_[t - kLeaves].first); }
  std::string str(uint32_t t) const {
    if (t < kLeaves) return fmt::format("{}", t);
    const auto [a, b] = kids_[t - kLeaves];
    return fmt::format("({}+{})", str(a), str(b));
  }

 private:
  static constexpr uint32_t kLeaves = 64;
  std::unordered_map<uint64_t, uint32_t> ids_;
  std::vector<std::pair<uint32_t, uint32_t>> kids_;
};

std::string describe(const Value& v) {
  if (v.poisoned) return "a poisoned value (double-counted or mixed elements)";
  if (v.ranks == 0) return "undefined data";
  std::string s = "ranks {";
  bool first = true;
  for (int r = 0; r < 64; ++r)
    if (v.ranks >> r & 1) {
      s += fmt::format("{}{}", first ? "" : ",", r);
      first = false;
    }
  return s + fmt::format("}} element {}", v.index);
}

Value combine(Trees& trees, const Value& a, const Value& b) {
  Value v;
  v.tree = trees.node(a.tree, b.tree);
  v.ranks = a.ranks | b.ranks;
  v.index = a.index;
  v.quant = std::max(a.quant, b.quant);
  v.scaled = a.scaled | b.scaled;
  v.divided = a.divided + b.divided;
  v.word = a.word && b.word;
  v.rounded = a.rounded || b.rounded;
  v.poisoned = a.poisoned || b.poisoned || a.ranks == 0 || b.ranks == 0 || (a.ranks & b.ranks) != 0 ||
               a.index != b.index;
  return v;
}

struct RankState {
  Program prog;
  Shape shape;  // this rank's view (v-arrays point into the case)
  std::vector<Value> buf[3];
  // Buf::Wire, one Value per byte: a quantized run of m elements holds their
  // values (quant + 1) in its first m bytes; the rest (scales, fp8's or the
  // second byte of bf16) hold nothing, so decoding them yields undefined data.
  std::vector<Value> wire;
  std::vector<bool> done;
  size_t ndone = 0;
  // Messages to (from) a peer complete in program order: a send or receive
  // step's turn is its place among the steps of its (peer, direction), and
  // next_turn counts those done, so the step may run when the two agree.
  std::vector<uint32_t> turn;
  std::map<std::pair<int, bool>, uint32_t> next_turn;  // (peer, sends)
  uint64_t heard = 0;  // ranks whose messages reached this rank, transitively (barrier)
};

bool isMessage(StepOp op) { return op == StepOp::Send || op == StepOp::Recv || op == StepOp::RecvReduce; }

struct Message {
  std::vector<Value> data;
  uint64_t heard;
};

}  // namespace

namespace {

// One symbolic run of every rank's program (verify()): set up the buffers,
// run the steps to a fixed point, check that everything finished, then compare
// the outputs with the collective's definition.
class Verifier {
 public:
  // algo's programs, or (algo nullptr) the given ones, named `name`.
  Verifier(const Algorithm* algo, std::string_view name, const VerifyCase& vc, std::vector<Program> given)
      : algo_(algo), name_(name), vc_(vc), n_(vc.shape.nranks), coll_(vc.shape.coll),
        all_(n_ == 64 ? ~0ull : ((1ull << n_) - 1)), canonical_(vc.shape.canonical && reduces(coll_)),
        canon_(canonical_ ? trees_.canonical(0, n_) : 0), max_quant_(algo ? algo->quantizations(vc.shape) : 0),
        premul_(reduces(coll_) && vc.shape.scaling == Scaling::PreMulSum),
        avg_(reduces(coll_) && vc.shape.scaling == Scaling::Avg), exact_words_(vc.shape.exact_words),
        given_(std::move(given)) {}
  Status run() {
    setUp();
    CHORUS_RETURN_IF_ERROR(execute());
    CHORUS_RETURN_IF_ERROR(checkFinished());
    for (int r = 0; r < n_; ++r) CHORUS_RETURN_IF_ERROR(compare(r));
    return {};
  }

 private:
  Status fail(int r, std::string what) const {
    return internalError("verifier: algorithm '{}' for {} with {} ranks (count {}, root {}{}{}): rank {}: {}",
                         name_, collectiveName(coll_), n_, vc_.shape.count, vc_.shape.root,
                         vc_.shape.inplace ? ", in place" : "", premul_ ? ", premulsum" : avg_ ? ", avg" : "", r,
                         what);
  }
  void setUp();
  Status execute();
  Result<bool> step(int r, size_t i);
  Status checkFinished() const;
  Status compare(int r);
  Result<bool> quantStep(int r, size_t i, const Step& step);
  Result<bool> scalingStep(int r, size_t i, const Step& step);
  Result<bool> exactStep(int r, size_t i, const Step& step);
  Status exactCombine(int r, size_t i, const Value& a, const Value& b) const;
  Status scaledBeforeUse(int r, size_t i, const std::vector<Value>& vals, uint64_t from, uint64_t count) const;
  static std::vector<Value>* load(RankState& s, const Region& g) {
    auto& b = g.buf == Buf::Wire ? s.wire : s.buf[static_cast<int>(g.buf)];
    if (g.count != 0 && g.end() > b.size()) return nullptr;
    return &b;
  }

  const Algorithm* algo_;
  std::string_view name_;
  const VerifyCase& vc_;
  const int n_;
  const Collective coll_;
  const uint64_t all_;  // every rank's bit
  Trees trees_;
  // Under canonical mode every reduced element must be the canonical tree.
  const bool canonical_;
  const uint32_t canon_;
  // The plan's declared bound on quantizations per element (Algorithm::quantizations).
  const int max_quant_;
  // Shape::scaling of a reducing collective: every contribution must be
  // scaled once before it is sent or combined, every result divided once
  // after its last combine.
  const bool premul_, avg_;
  // Shape::exact_words: every combination must add accumulator words, and
  // only a rank's own input may be encoded (so each output element is the
  // exact sum, rounded once by its Decode).
  const uint32_t exact_words_;
  std::vector<Program> given_;  // verifyPrograms()'s
  std::vector<RankState> st_;
  std::map<std::pair<int, int>, std::deque<Message>> chan_;  // (from, to)
};

// Every rank's program and buffers: element i of rank r's input is (r, i);
// with an in-place alias the input lives inside the output (or vice versa).
void Verifier::setUp() {
  st_.resize(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r) {
    Shape s = vc_.shape;
    if (!vc_.hosts.empty()) s.hosts = vc_.hosts;
    if (coll_ == Collective::AllGatherV) {
      s.counts = vc_.counts;
      s.displs = vc_.displs;
    } else if (coll_ == Collective::AllToAllV) {
      s.counts = vc_.send_counts[r];
      s.displs = vc_.send_displs[r];
      s.counts2 = vc_.recv_counts[r];
      s.displs2 = vc_.recv_displs[r];
    }
    st_[r].shape = s;
    if (algo_ != nullptr)
      expand(*algo_, s, r, &st_[r].prog);
    else
      st_[r].prog = given_[static_cast<size_t>(r)];
    const Alias al = inplaceAlias(s, r);
    uint64_t in_n = s.inputElems(r), out_n = s.outputElems(r);
    auto& B = st_[r].buf;
    B[1].assign(out_n, Value{});
    B[0].assign(in_n, Value{});
    if (al.from != al.to) {
      auto& outer = B[static_cast<int>(al.to)];
      uint64_t inner_n = al.from == Buf::Input ? in_n : out_n;
      if (outer.size() < al.offset + inner_n) outer.resize(al.offset + inner_n);
    }
    B[2].assign(st_[r].prog.scratch_elems, Value{});
    st_[r].wire.assign(st_[r].prog.wire_bytes, Value{});
    for (uint64_t i = 0; i < in_n; ++i) {
      Value v{1ull << r, i, false, static_cast<uint32_t>(r)};
      if (al.from == Buf::Input && al.to == Buf::Output)
        B[1][al.offset + i] = v;
      else
        B[0][i] = v;
    }
    st_[r].done.assign(st_[r].prog.size(), false);
    st_[r].turn.assign(st_[r].prog.size(), 0);
    std::map<std::pair<int, bool>, uint32_t> turns;
    for (size_t i = 0; i < st_[r].prog.size(); ++i)
      if (const Step& step = st_[r].prog.steps[i]; isMessage(step.op))
        st_[r].turn[i] = turns[{step.peer, step.op == StepOp::Send}]++;
    st_[r].heard = 1ull << r;
  }
}

// Runs every ready step of every rank until none can run.
Status Verifier::execute() {
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < n_; ++r) {
      RankState& s = st_[r];
      for (size_t i = 0; i < s.prog.size(); ++i) {
        if (s.done[i]) continue;
        bool ready = true;
        for (uint32_t d : s.prog.depsOf(i)) ready = ready && s.done[d];
        if (!ready) continue;
        CHORUS_ASSIGN_OR_RETURN(const bool ran, step(r, i));
        if (!ran) continue;
        s.done[i] = true;
        ++s.ndone;
        if (const Step& step = s.prog.steps[i]; isMessage(step.op)) ++s.next_turn[{step.peer, step.op == StepOp::Send}];
        progress = true;
      }
    }
  }
  return {};
}

// Step i of rank r, whose dependencies are done: false when it must wait (an
// earlier message to or from the same peer, or a message not yet sent).
Result<bool> Verifier::step(int r, size_t i) {
  RankState& s = st_[r];
  const Step& step = s.prog.steps[i];
  // Messages to/from a peer are posted in program order: an earlier
  // unfinished send (receive) to the same peer blocks this one.
  auto inOrder = [&](bool sends) { return s.turn[i] == s.next_turn[{step.peer, sends}]; };
  switch (step.op) {
    case StepOp::Send: {
      if (!inOrder(true)) return false;
      auto* b = load(s, step.src);
      if (!b) return fail(r, fmt::format("step {} reads past the end of its buffer", i));
      CHORUS_RETURN_IF_ERROR(scaledBeforeUse(r, i, *b, step.src.offset, step.src.count));
      Message m{std::vector<Value>(b->begin() + step.src.offset, b->begin() + step.src.end()), s.heard};
      chan_[{r, step.peer}].push_back(std::move(m));
      return true;
    }
    case StepOp::Recv:
    case StepOp::RecvReduce: {
      if (!inOrder(false)) return false;
      auto& q = chan_[{step.peer, r}];
      if (q.empty()) return false;
      Message m = std::move(q.front());
      q.pop_front();
      if (m.data.size() != step.dst.count)
        return fail(r, fmt::format("step {} expects {} elements from rank {} but the message has {}", i,
                                   step.dst.count, step.peer, m.data.size()));
      auto* d = load(s, step.dst);
      if (!d) return fail(r, fmt::format("step {} writes past the end of its buffer", i));
      if (step.op == StepOp::RecvReduce) {
        auto* a = load(s, step.src);
        if (!a) return fail(r, fmt::format("step {} reads past the end of its buffer", i));
        CHORUS_RETURN_IF_ERROR(scaledBeforeUse(r, i, *a, step.src.offset, step.src.count));
        std::vector<Value> acc(a->begin() + step.src.offset, a->begin() + step.src.end());
        for (uint64_t e = 0; e < step.dst.count; ++e) {
          CHORUS_RETURN_IF_ERROR(exactCombine(r, i, acc[e], m.data[e]));
          (*d)[step.dst.offset + e] = combine(trees_, acc[e], m.data[e]);
        }
      } else {
        for (uint64_t e = 0; e < step.dst.count; ++e) (*d)[step.dst.offset + e] = m.data[e];
      }
      s.heard |= m.heard;
      return true;
    }
    case StepOp::Copy: {
      auto* a = load(s, step.src);
      auto* d = load(s, step.dst);
      if (!a || !d || step.src.count != step.dst.count)
        return fail(r, fmt::format("copy step {} is out of bounds or mis-sized", i));
      std::vector<Value> tmp(a->begin() + step.src.offset, a->begin() + step.src.end());
      std::copy(tmp.begin(), tmp.end(), d->begin() + step.dst.offset);
      return true;
    }
    case StepOp::Quantize:
    case StepOp::Dequantize:
    case StepOp::DequantizeReduce: return quantStep(r, i, step);
    case StepOp::Scale:
    case StepOp::Divide: return scalingStep(r, i, step);
    case StepOp::Encode:
    case StepOp::Decode:
    case StepOp::DecodeAdd:
    case StepOp::EncodeAdd: return exactStep(r, i, step);
    case StepOp::Reduce: {
      auto* a = load(s, step.src);
      auto* c = load(s, step.src2);
      auto* d = load(s, step.dst);
      if (!a || !c || !d) return fail(r, fmt::format("reduce step {} is out of bounds", i));
      CHORUS_RETURN_IF_ERROR(scaledBeforeUse(r, i, *a, step.src.offset, step.src.count));
      CHORUS_RETURN_IF_ERROR(scaledBeforeUse(r, i, *c, step.src2.offset, step.src2.count));
      std::vector<Value> x(a->begin() + step.src.offset, a->begin() + step.src.end());
      std::vector<Value> y(c->begin() + step.src2.offset, c->begin() + step.src2.end());
      for (uint64_t e = 0; e < step.dst.count; ++e) {
        CHORUS_RETURN_IF_ERROR(exactCombine(r, i, x[e], y[e]));
        (*d)[step.dst.offset + e] = combine(trees_, x[e], y[e]);
      }
      return true;
    }
  }
  return true;
}

// Exact plans: a combination of anything but two defined word values would
// round (or mix a word with a float); outside them no value is a word.
Status Verifier::exactCombine(int r, size_t i, const Value& a, const Value& b) const {
  if (exact_words_ == 0 || (a.word && b.word)) return {};
  if (a.ranks == 0 || b.ranks == 0) return {};  // undefined data: compare() reports the result
  return fail(r, fmt::format("step {} combines {} as {} with {} as {}: an exact plan adds accumulator words only", i,
                             describe(a), a.word ? "words" : "a float", describe(b), b.word ? "words" : "a float"));
}

// Encode: a single rank's input as it is (never a partial sum, never a
// rounded value) into words; Decode: words back into the call's type, the
// value's one rounding; DecodeAdd: both, this rank's own input's words added
// to the words of src2 (words, or a single rank's input as it is) before the
// one rounding; EncodeAdd: the words of two such inputs, added.  The wire
// region holds 8 x exact_words bytes per element, and every byte of an
// element's words carries its value (so a RecvReduce over the bytes combines
// each element's value with itself once per byte, identically).
Result<bool> Verifier::exactStep(int r, size_t i, const Step& step) {
  RankState& s = st_[r];
  const StepOp op = step.op;
  const bool enc = op == StepOp::Encode || op == StepOp::EncodeAdd;
  if (exact_words_ == 0 || s.prog.exact_words != exact_words_)
    return fail(r, fmt::format("step {} {} accumulator words but the plan is not exact (or has the wrong word count)",
                               i, enc ? "encodes" : "decodes"));
  const uint64_t per = uint64_t{8} * exact_words_;
  // The words' region and the call type's (the output, or the encoded input).
  const Region& wr = enc ? step.dst : op == StepOp::DecodeAdd ? step.src2 : step.src;
  const Region& fr = enc ? step.src : step.dst;
  const bool raw2 = (op == StepOp::DecodeAdd && step.src2.buf != Buf::Wire) || op == StepOp::EncodeAdd;
  const bool two = op == StepOp::DecodeAdd || op == StepOp::EncodeAdd;
  const Region& own_r = step.src;  // the own input of the two-operand steps
  const bool sizes = raw2 && op == StepOp::DecodeAdd
                         ? step.src2.count == fr.count && own_r.count == fr.count
                         : wr.buf == Buf::Wire && wr.count == fr.count * per &&
                               (!two || own_r.count == fr.count) && (op != StepOp::EncodeAdd || step.src2.count == fr.count);
  if (fr.buf == Buf::Wire || (two && own_r.buf == Buf::Wire) || !sizes)
    return fail(r, fmt::format("step {} converts {} elements through a region of {} bytes (needs Buf::Wire, {} "
                               "bytes, and operands of the call's type)", i, fr.count, wr.count, fr.count * per));
  auto* f = load(s, fr);
  auto* o = load(s, own_r);
  auto* x = load(s, step.src2);
  auto* w = raw2 && op == StepOp::DecodeAdd ? x : load(s, wr);
  if (!w || !f || !o || (two && !x)) return fail(r, fmt::format("step {} is out of bounds", i));
  // A value this plan may encode: one rank's input, never combined, rounded or encoded before.
  auto rawWords = [&](Value v) -> Result<Value> {
    const bool single = v.ranks != 0 && (v.ranks & (v.ranks - 1)) == 0;
    if (v.ranks != 0 && (!single || v.word || v.rounded || v.poisoned))
      return fail(r, fmt::format("step {} encodes {}{}: an exact plan encodes only a single rank's input as it is",
                                 i, describe(v), v.word ? " (already words)" : v.rounded ? " (a rounded value)" : ""));
    v.word = v.ranks != 0;
    return v;
  };
  const std::vector<Value> src(o->begin() + own_r.offset, o->begin() + own_r.end());
  const std::vector<Value> src2 = two ? std::vector<Value>(x->begin() + step.src2.offset, x->begin() + step.src2.end())
                                      : std::vector<Value>{};
  if (enc) {
    for (uint64_t e = 0; e < fr.count; ++e) {
      CHORUS_ASSIGN_OR_RETURN(Value v, rawWords(src[e]));
      if (op == StepOp::EncodeAdd) {
        CHORUS_ASSIGN_OR_RETURN(const Value u, rawWords(src2[e]));
        v = combine(trees_, v, u);
      }
      std::fill(w->begin() + wr.offset + e * per, w->begin() + wr.offset + (e + 1) * per, v);
    }
    return true;
  }
  std::vector<Value> dec(fr.count);
  for (uint64_t e = 0; e < fr.count; ++e) {
    if (raw2) {
      CHORUS_ASSIGN_OR_RETURN(dec[e], rawWords(src2[e]));
    } else {
      dec[e] = (*w)[wr.offset + e * per];
      if (dec[e].ranks != 0 && !dec[e].word)
        return fail(r, fmt::format("step {} decodes {}, which is not accumulator words", i, describe(dec[e])));
    }
    if (two) {
      if (src[e].ranks != 0 && src[e].ranks != (1ull << r))
        return fail(r, fmt::format("step {} adds {} as this rank's own input", i, describe(src[e])));
      CHORUS_ASSIGN_OR_RETURN(const Value v, rawWords(src[e]));
      dec[e] = combine(trees_, v, dec[e]);
    }
    dec[e].word = false;
    dec[e].rounded = dec[e].ranks != 0;
  }
  std::copy(dec.begin(), dec.end(), f->begin() + fr.offset);
  return true;
}

// A compressed plan's local step: the wire region must be exactly the
// format's size for the fp32 region, and no element may be quantized more
// often than the plan declares.
Result<bool> Verifier::quantStep(int r, size_t i, const Step& step) {
  RankState& s = st_[r];
  const bool q = step.op == StepOp::Quantize;
  const Region& wr = q ? step.dst : (step.op == StepOp::Dequantize ? step.src : step.src2);
  const Region& fr = q ? step.src : step.dst;
  if (!s.prog.wire) return fail(r, fmt::format("step {} (de)quantizes but the plan has no wire format", i));
  if (wr.buf != Buf::Wire || fr.buf == Buf::Wire)
    return fail(r, fmt::format("step {} (de)quantizes between the wrong buffers (the wire must be Buf::Wire)", i));
  if (wr.count != kernels::wireBytes(*s.prog.wire, fr.count))
    return fail(r, fmt::format("step {} uses a wire region of {} bytes for {} elements ({} needs {})", i, wr.count,
                               fr.count, kernels::wireFormatName(*s.prog.wire),
                               kernels::wireBytes(*s.prog.wire, fr.count)));
  auto* w = load(s, wr);
  auto* f = load(s, fr);
  auto* a = step.op == StepOp::DequantizeReduce ? load(s, step.src) : f;
  if (!w || !f || !a || (step.op == StepOp::DequantizeReduce && step.src.count != fr.count))
    return fail(r, fmt::format("step {} is out of bounds or mis-sized", i));
  const uint64_t m = fr.count;
  CHORUS_RETURN_IF_ERROR(q ? scaledBeforeUse(r, i, *f, fr.offset, m) : Status{});
  if (step.op == StepOp::DequantizeReduce) CHORUS_RETURN_IF_ERROR(scaledBeforeUse(r, i, *a, step.src.offset, m));
  if (q) {
    std::vector<Value> tmp(f->begin() + fr.offset, f->begin() + fr.end());
    for (uint64_t e = 0; e < m; ++e) {
      if (tmp[e].ranks != 0 && static_cast<int>(tmp[e].quant) + 1 > max_quant_)
        return fail(r, fmt::format("step {} would quantize {} {} times, but the plan declares at most {} "
                                   "quantizations per element", i, describe(tmp[e]), tmp[e].quant + 1, max_quant_));
      tmp[e].quant += 1;
    }
    std::fill(w->begin() + wr.offset, w->begin() + wr.end(), Value{});
    std::copy(tmp.begin(), tmp.end(), w->begin() + wr.offset);
    return true;
  }
  std::vector<Value> dec(w->begin() + wr.offset, w->begin() + wr.offset + m);
  if (step.op == StepOp::DequantizeReduce) {
    std::vector<Value> acc(a->begin() + step.src.offset, a->begin() + step.src.end());
    for (uint64_t e = 0; e < m; ++e) dec[e] = combine(trees_, acc[e], dec[e]);
  }
  std::copy(dec.begin(), dec.end(), f->begin() + fr.offset);
  return true;
}

// PreMulSum: values a step sends, quantizes or combines must carry every
// contributor's scale already (scaling a rank's input after it left would
// leave the sent copy unscaled).
Status Verifier::scaledBeforeUse(int r, size_t i, const std::vector<Value>& vals, uint64_t from,
                                 uint64_t count) const {
  if (!premul_) return {};
  for (uint64_t e = from; e < from + count && e < vals.size(); ++e) {
    const Value& v = vals[e];
    if (v.ranks != 0 && !v.poisoned && (v.scaled & v.ranks) != v.ranks)
      return fail(r, fmt::format("step {} sends or combines {} before it is scaled (PreMulSum scales every "
                                 "contribution before it is read)", i, describe(v)));
  }
  return {};
}

// Scale (PreMulSum): this rank's own input, each element once.  Divide (Avg):
// a final sum (every rank's contribution), each element once.
Result<bool> Verifier::scalingStep(int r, size_t i, const Step& step) {
  RankState& s = st_[r];
  const bool scale = step.op == StepOp::Scale;
  if (scale ? !premul_ : !avg_)
    return fail(r, fmt::format("step {} {} but the call's op is not {}", i, scale ? "scales" : "divides",
                               scale ? "a PreMulSum" : "Avg"));
  auto* a = load(s, step.src);
  auto* d = load(s, step.dst);
  if (!a || !d || step.src.count != step.dst.count)
    return fail(r, fmt::format("step {} is out of bounds or mis-sized", i));
  std::vector<Value> tmp(a->begin() + step.src.offset, a->begin() + step.src.end());
  for (Value& v : tmp) {
    if (v.ranks == 0 || v.poisoned) continue;
    if (scale && v.ranks != (1ull << r))
      return fail(r, fmt::format("step {} scales {}, not this rank's own input", i, describe(v)));
    if (scale && v.scaled != 0) return fail(r, fmt::format("step {} scales {} a second time", i, describe(v)));
    if (!scale && v.ranks != all_)
      return fail(r, fmt::format("step {} divides {} before its last combine (Avg divides the final sum)", i,
                                 describe(v)));
    if (!scale && v.divided != 0) return fail(r, fmt::format("step {} divides {} a second time", i, describe(v)));
    if (scale)
      v.scaled = 1ull << r;
    else
      v.divided = 1;
  }
  std::copy(tmp.begin(), tmp.end(), d->begin() + step.dst.offset);
  return true;
}

// Every step ran (else: a deadlock, named by its first stuck step) and every
// message was received.
Status Verifier::checkFinished() const {
  for (int r = 0; r < n_; ++r)
    if (st_[r].ndone != st_[r].prog.size()) {
      size_t i = 0;
      while (st_[r].done[i]) ++i;
      const Step& s = st_[r].prog.steps[i];
      return fail(r, fmt::format("deadlock: step {} ({} peer {}) never completes", i, static_cast<int>(s.op), s.peer));
    }
  for (const auto& [k, q] : chan_)
    if (!q.empty())
      return fail(k.first, fmt::format("{} message(s) to rank {} were never received", q.size(), k.second));
  return {};
}

// Rank r's output against the collective's definition.
Status Verifier::compare(int r) {
  const uint64_t c = vc_.shape.count;
  const int n = n_;
  const uint64_t all = all_;
  RankState& s = st_[r];
  const Alias al = inplaceAlias(s.shape, r);
  auto outAt = [&](uint64_t i) -> Value {
    if (al.from == Buf::Output && al.to == Buf::Input) return s.buf[0][al.offset + i];
    return s.buf[1][i];
  };
  auto expect = [&](uint64_t i, Value want) -> Status {
    Value got = outAt(i);
    want.tree = canonical_ ? canon_ : got.tree;
    want.quant = got.quant;
    want.rounded = got.rounded;
    want.scaled = premul_ ? want.ranks : 0;
    want.divided = avg_ ? 1 : 0;
    if (static_cast<int>(got.quant) > max_quant_)
      return fail(r, fmt::format("output element {} was quantized {} times, but the plan declares at most {}", i,
                                 got.quant, max_quant_));
    if (got == want) return {};
    const bool same = got.ranks == want.ranks && got.index == want.index && !got.poisoned;
    if (same && got.scaled != want.scaled)
      return fail(r, fmt::format("output element {} holds {} of which ranks' contributions {:#x} were scaled, "
                                 "not {:#x}", i, describe(got), got.scaled, want.scaled));
    if (same && got.word)
      return fail(r, fmt::format("output element {} holds {} still as accumulator words (never decoded)", i,
                                 describe(got)));
    if (same && got.divided != want.divided)
      return fail(r, fmt::format("output element {} was divided {} times, not {}", i, got.divided, want.divided));
    if (canonical_ && got.ranks == want.ranks && got.index == want.index && !got.poisoned)
      return fail(r, fmt::format("output element {} combines {} but the canonical tree of {} ranks is {}", i,
                                 trees_.str(got.tree), n, trees_.str(canon_)));
    return fail(r, fmt::format("output element {} holds {} but should hold {}", i, describe(got), describe(want)));
  };
  auto one = [](int rank) { return 1ull << rank; };
  switch (coll_) {
    case Collective::AllReduce:
      for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(i, {all, i}));
      break;
    case Collective::Broadcast:
      for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(i, {one(s.shape.root), i}));
      break;
    case Collective::Reduce:
      if (r == s.shape.root)
        for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(i, {all, i}));
      break;
    case Collective::AllGather:
      for (int j = 0; j < n; ++j)
        for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(j * c + i, {one(j), i}));
      break;
    case Collective::ReduceScatter:
      for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(i, {all, r * c + i}));
      break;
    case Collective::AllToAll:
      for (int j = 0; j < n; ++j)
        for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(j * c + i, {one(j), r * c + i}));
      break;
    case Collective::Gather:
      if (r == s.shape.root)
        for (int j = 0; j < n; ++j)
          for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(j * c + i, {one(j), i}));
      break;
    case Collective::Scatter:
      for (uint64_t i = 0; i < c; ++i) CHORUS_RETURN_IF_ERROR(expect(i, {one(s.shape.root), r * c + i}));
      break;
    case Collective::AllGatherV:
      for (int j = 0; j < n; ++j)
        for (uint64_t i = 0; i < vc_.counts[j]; ++i) CHORUS_RETURN_IF_ERROR(expect(vc_.displs[j] + i, {one(j), i}));
      break;
    case Collective::AllToAllV:
      for (int j = 0; j < n; ++j)
        for (uint64_t i = 0; i < vc_.recv_counts[r][j]; ++i)
          CHORUS_RETURN_IF_ERROR(expect(vc_.recv_displs[r][j] + i, {one(j), vc_.send_displs[j][r] + i}));
      break;
    case Collective::Barrier:
      if (s.heard != all)
        return fail(r, fmt::format("leaves the barrier having heard only from {}", describe({s.heard, 0})));
      break;
  }
  return {};
}

}  // namespace

Status verify(const Algorithm& algo, const VerifyCase& vc) {
  const int n = vc.shape.nranks;
  if (n < 1 || n > 64) return invalidArgument("verify: nranks {} outside 1..64", n);
  return Verifier(&algo, algo.name(), vc, {}).run();
}

Status verifyPrograms(std::string_view name, const VerifyCase& vc, std::vector<Program> progs) {
  const int n = vc.shape.nranks;
  if (n < 1 || n > 64) return invalidArgument("verify: nranks {} outside 1..64", n);
  if (progs.size() != static_cast<size_t>(n))
    return invalidArgument("verify: {} programs for {} ranks", progs.size(), n);
  return Verifier(nullptr, name, vc, std::move(progs)).run();
}

}  // namespace chorus::plan
