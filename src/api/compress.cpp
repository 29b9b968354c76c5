#include "api/compress.hpp"

#include "kernels/dtype.hpp"
#include "kernels/quantize.hpp"

namespace chorus::api {
namespace {

constexpr std::string_view kModes =
    "CHORUS_COMPRESS_DEFAULT=-1, CHORUS_COMPRESS_OFF=0, CHORUS_COMPRESS_BF16=1, CHORUS_COMPRESS_FP8=2";
constexpr std::string_view kSupported =
    "compressed calls support datatype=chorusFloat32 with op chorusSum, chorusAvg or a premulsum op, in "
    "chorusAllReduceEx, chorusReduceScatterEx and chorusAllGatherEx";

std::string opName(chorusRedOp_t op) {
  switch (op) {
    case chorusProd: return "chorusProd";
    case chorusMax: return "chorusMax";
    case chorusMin: return "chorusMin";
    default: return fmt::format("{}", static_cast<int>(op));
  }
}

kernels::WireFormat formatOf(CompressKind kind, int block) {
  return {kind == CompressKind::Bf16 ? kernels::WireFormat::Bf16 : kernels::WireFormat::Fp8E4m3, block};
}

// Why op cannot travel compressed ("" when it can): fp32 accumulation of
// sums only (a quantized max or product has no error bound of this kind).
std::string unsupported(const OpDesc& op, const Config& cfg) {
  if (op.dtype != chorusFloat32)
    return fmt::format("datatype={} cannot be compressed", kernels::dtypeName(op.dtype));
  if (plan::reduces(op.coll) && !(op.op == chorusSum || op.op == chorusAvg || op.op >= chorusNumOps))
    return fmt::format("op={} cannot be compressed", opName(op.op));
  if (cfg.reproducible != Reproducible::Off)
    return "compression cannot be combined with CHORUS_REPRODUCIBLE (canonical or exact)";
  return {};
}

}  // namespace

Status applyCompressConfig(int compress, int block, Config& cfg) {
  if (compress != -1) {
    if (compress < CHORUS_COMPRESS_OFF || compress > CHORUS_COMPRESS_FP8)
      return invalidArgument("chorusCommInitRankConfig: config.compress={} is not a mode (accepted: "
                             "CHORUS_COMPRESS_OFF=0, CHORUS_COMPRESS_BF16=1, CHORUS_COMPRESS_FP8=2, or -1: "
                             "CHORUS_COMPRESS)", compress);
    cfg.compress.kind = static_cast<CompressKind>(compress);
  }
  if (block != -1) {
    CHORUS_RETURN_IF_ERROR(kernels::checkWireFormat(formatOf(CompressKind::Fp8, block),
                                                    "chorusCommInitRankConfig: config.compressBlock (or -1)"));
    cfg.compress.block = block;
  }
  return {};
}

Status resolveCompression(const char* fn, const chorusCallOptions_t* options, const Config& cfg, OpDesc& op) {
  op.wire.reset();
  int mode = CHORUS_COMPRESS_DEFAULT, block = -1;
  if (options != nullptr) {
    if (options->size != sizeof(chorusCallOptions_t))
      return invalidArgument("{}: options is not initialised (size={}); start from CHORUS_CALL_OPTIONS_INITIALIZER",
                             fn, options->size);
    mode = options->compress;
    block = options->fp8Block;
  }
  if (block != -1)
    CHORUS_RETURN_IF_ERROR(kernels::checkWireFormat(formatOf(CompressKind::Fp8, block),
                                                    fmt::format("{}: options.fp8Block (or -1)", fn)));
  if (block == -1) block = cfg.compress.block;
  switch (mode) {
    case CHORUS_COMPRESS_OFF: return {};
    case CHORUS_COMPRESS_DEFAULT:
      // The communicator's default is a policy for the calls it can serve:
      // an int32 allreduce of a training loop's counters stays exact.
      if (cfg.compress.kind != CompressKind::Off && unsupported(op, cfg).empty())
        op.wire = formatOf(cfg.compress.kind, block);
      return {};
    case CHORUS_COMPRESS_BF16:
    case CHORUS_COMPRESS_FP8: {
      if (std::string why = unsupported(op, cfg); !why.empty())
        return invalidArgument("{}: options.compress={} but {} ({})", fn,
                               mode == CHORUS_COMPRESS_BF16 ? "CHORUS_COMPRESS_BF16" : "CHORUS_COMPRESS_FP8", why,
                               kSupported);
      op.wire = formatOf(mode == CHORUS_COMPRESS_BF16 ? CompressKind::Bf16 : CompressKind::Fp8, block);
      return {};
    }
    default:
      return invalidArgument("{}: options.compress={} is not a mode (accepted: {})", fn, mode, kModes);
  }
}

}  // namespace chorus::api
