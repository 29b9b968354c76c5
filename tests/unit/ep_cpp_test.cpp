// chorus::ExpertParallel::dispatchFp8 (include/chorus/chorus.hpp), the C++
// wrapper of chorusEpDispatchFp8, through the public headers only: 2 ranks
// (threads), 4 experts, top-2, hidden 64 float32, fp8 wire with block 32.
// The codes x scales it hands out are the rows the decoding fp8 dispatch
// delivers (float32 data: the decode is exact), the weights the same, and a
// scale span one float short is refused on every rank.  ep_test checks the
// codes and scales bitwise against its own quantizer through the C API.
#include <chorus/chorus.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using chorus::Communicator;

std::string runComms(int n, const std::function<std::string(Communicator&)>& body) {
  auto id = chorus::UniqueId::create();
  if (!id.ok()) return "UniqueId::create: " + id.status().toString();
  std::vector<std::string> msgs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = Communicator::initRank(n, *id, r);
      if (!comm.ok()) {
        msgs[static_cast<size_t>(r)] = "init: " + comm.status().toString();
        return;
      }
      msgs[static_cast<size_t>(r)] = body(*comm);
      (void)comm->destroy();
    });
  for (auto& t : threads) t.join();
  std::string all;
  for (const auto& m : msgs) all += m.empty() ? "" : m + "\n";
  return all;
}

// An e4m3 (FN) code's value by its defining formula: S.EEEE.MMM, bias 7.
float e4m3Value(uint8_t c) {
  const int ex = (c >> 3) & 15, m = c & 7;
  const float a = ex == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, ex - 7);
  return (c & 0x80) ? -a : a;
}

TEST(EpCpp, DispatchFp8HandsOutTheDecodedRowsAsCodesAndScales) {
  EXPECT_EQ(runComms(2, [](Communicator& comm) -> std::string {
              const int r = comm.rank();
              auto epr = chorus::ExpertParallel<float, int32_t>::create(comm, 4, 2, 64, 0, CHORUS_COMPRESS_FP8, 32);
              if (!epr.ok()) return "create: " + epr.status().toString();
              auto ep = std::move(*epr);
              const std::vector<int32_t> ids = {0, 3, 1, 2, 2, 0};
              std::vector<float> x(3 * 64);
              const std::vector<float> w(6, 0.5f);
              for (size_t i = 0; i < x.size(); ++i)
                x[i] = static_cast<float>((i * 7 + static_cast<size_t>(r) * 13) % 29) - 14.0f;
              auto lay = ep.layout(ids);
              if (!lay.ok()) return "layout: " + lay.status().toString();
              const size_t n = lay->numRecv;
              if (n == 0) return "no rows arrive";
              std::vector<float> rx(n * 64), rw(n), scales(n * 2), cw(n);
              std::vector<uint8_t> codes(n * 64);
              if (auto st = ep.dispatch(x, w, rx, rw); !st.ok()) return "dispatch: " + st.toString();
              if (auto st = ep.dispatchFp8(x, w, codes, scales, cw); !st.ok()) return "dispatchFp8: " + st.toString();
              for (size_t i = 0; i < n * 64; ++i)
                if (e4m3Value(codes[i]) * scales[i / 32] != rx[i])
                  return "rank " + std::to_string(r) + ": element " + std::to_string(i) + " decodes differently";
              if (cw != rw) return "rank " + std::to_string(r) + ": weights differ";
              auto st = ep.dispatchFp8(x, w, codes, std::span<float>(scales).first(r == 1 ? n * 2 - 1 : n * 2), cw);
              if (st.ok() || st.toString().find(r == 1 ? "recvScales holds" : "rank 1 refused") == std::string::npos)
                return "rank " + std::to_string(r) + ": a short scale span gave " + st.toString();
              return "";
            }),
            "");
}

}  // namespace
