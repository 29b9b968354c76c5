// The XML subset reader (src/common/xml.*) and MSCCL's algorithm format read
// into a plan (src/plan/msccl_file.cpp, docs/msccl.md), on small inputs
// written here: what the reader accepts, every malformed input refused with
// its line, element and attribute, and small MSCCL programs that are proven,
// or refused with their counter-example (a wrong result, a race between
// thread blocks, a deadlock, a message order chorus cannot keep).  The real
// files from RCCL are in msccl_file_test.cpp.  (In the ASan subset: parsers
// of untrusted bytes.)
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "common/xml.hpp"
#include "plan/plan_file.hpp"

namespace chorus {
namespace {

TEST(Xml, ReadsElementsAttributesCommentsAndTheDeclaration) {
  auto doc = parseXml(R"(<?xml version="1.0" encoding="UTF-8"?>
<!-- a comment -->
<system version='1'>
  <cpu numaid="0" note="a &lt;b&gt; &amp; &quot;c&quot; &apos;d&apos; &#65;&#x42;">
    <gpu dev="0"/>
    <!-- another
         comment -->
    <gpu dev = "1" ></gpu>
  </cpu>
</system>
<!-- after -->
)", "t.xml");
  ASSERT_TRUE(doc.isOk()) << doc.status().message();
  EXPECT_EQ(doc->name, "system");
  EXPECT_EQ(doc->line, 3u);
  ASSERT_EQ(doc->children.size(), 1u);
  const XmlElement& cpu = doc->children[0];
  ASSERT_NE(cpu.find("note"), nullptr);
  EXPECT_EQ(cpu.find("note")->value, "a <b> & \"c\" 'd' AB");
  ASSERT_EQ(cpu.children.size(), 2u);
  EXPECT_EQ(cpu.children[1].find("dev")->value, "1");
  EXPECT_EQ(cpu.children[1].line, 8u);
  EXPECT_EQ(cpu.find("missing"), nullptr);
}

TEST(Xml, MalformedInputsNameTheLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "t.xml:1: no element"},
      {"<a>\n<b>\n</a>", "t.xml:3: </a> closes <b> (opened on line 2)"},
      {"<a>\n<b/>", "t.xml:1: <a> is never closed"},
      {"<a>\n  hello\n</a>", "t.xml:2: <a>: text 'hello"},
      {"<!DOCTYPE a>\n<a/>", "t.xml:1: a DOCTYPE"},
      {"<a>\n<![CDATA[x]]></a>", "t.xml:2: a CDATA section"},
      {"<a>\n<?pi x?></a>", "t.xml:2: a processing instruction"},
      {"<a x=\"1\"\n x=\"2\"/>", "t.xml:2: <a>: attribute 'x' given twice"},
      {"<a x=1/>", "t.xml:1: <a> attribute 'x': the value is not quoted"},
      {"<a x=\"&bogus;\"/>", "t.xml:1: <a> attribute 'x': entity '&bogus;'"},
      {"<a x=\"&#200;\"/>", "character reference '&#200;' is not one of ASCII"},
      {"<a x=\"a<b\"/>", "'<' in a value"},
      {"<a x=\"1/>", "t.xml:1: <a> attribute 'x': the value never ends"},
      {"<a/>\n<b/>", "t.xml:2: '<b/>' after the root element <a> closed"},
      {"<a>\n<!-- never closed", "t.xml:2: a comment '<!--' that never ends"},
      {"\n\n<1a/>", "t.xml:3: an element: '1a/>' is not a name"},
      {"<a b/>", "t.xml:1: <a> attribute 'b': no '='"},
      {"<a>\n<b>\n<c>\n<d>\n<e/></d></c></b></a>", "t.xml:5: elements nest deeper than 4 levels"},
      {"\n<a/>\n<?xml version=\"1.0\"?>", "t.xml:3: a processing instruction"},
  };
  XmlLimits lim;
  lim.max_depth = 4;
  for (const auto& [text, want] : cases) {
    auto doc = parseXml(text, "t.xml", lim);
    ASSERT_FALSE(doc.isOk()) << text;
    EXPECT_NE(doc.status().message().find(want), std::string::npos) << text << "\n -> " << doc.status().message();
  }
  // Limits: bytes, elements, attributes, lengths.
  lim = {};
  lim.max_bytes = 10;
  EXPECT_NE(parseXml("<aaaaaaaaaaaa/>", "t.xml", lim).status().message().find("at most 10"), std::string::npos);
  lim = {};
  lim.max_elements = 2;
  EXPECT_NE(parseXml("<a><b/><c/></a>", "t.xml", lim).status().message().find("more than 2 elements"),
            std::string::npos);
  lim = {};
  lim.max_value = 3;
  EXPECT_NE(parseXml("<a x=\"abcd\"/>", "t.xml", lim).status().message().find("longer than 3"), std::string::npos);
}

}  // namespace

namespace plan {
namespace {

// A 2-GPU allreduce by hand: each GPU sends its input to the other and
// receives the other's into scratch (thread block 0), copies its input to its
// output and adds the scratch once the receive is done (thread block 1, whose
// `re` waits for tb 0's step 1).  {RE} and {CPY} can be replaced.
constexpr const char* kPair = R"(<algo name="pair" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="1">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      {RE}
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="1" s_chunks="1">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";
constexpr const char* kRe =
    R"(<step s="1" type="re" srcbuf="s" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="1" hasdep="0"/>)";

std::string replaced(std::string text, std::string_view from, std::string_view to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}
std::string pair(std::string_view re = kRe) { return replaced(kPair, "{RE}", re); }

// Read and proven, or the message of the first refusal.
std::string importAndProve(const std::string& text, const char* origin = "pair.xml") {
  auto spec = parseMscclXml(text, origin);
  if (!spec.isOk()) return spec.status().message();
  auto algo = buildPlan(std::move(*spec));
  return algo.isOk() ? "" : algo.status().message();
}

TEST(MscclXml, HandWrittenPairIsReadAndProven) {
  auto spec = parseMscclXml(pair(), "dir/My Pair.xml");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_EQ(spec->name, "my_pair");  // the file's stem
  EXPECT_EQ(spec->coll, Collective::AllReduce);
  EXPECT_EQ(spec->nranks, 2);
  EXPECT_EQ(spec->chunks, 1u);
  EXPECT_EQ(spec->scratch, 1u);
  EXPECT_EQ(spec->inplace, PlanInPlace::No);
  // GPU 0: the copy and the send run first, then the receive, then the add.
  ASSERT_EQ(spec->programs[0].size(), 4u);
  EXPECT_EQ(spec->programs[0][3].op, StepOp::Reduce);
  EXPECT_EQ(spec->programs[0][3].dst.buf, Buf::Output);
  EXPECT_EQ(spec->programs[0][3].src2.buf, Buf::Scratch);
  EXPECT_EQ(importAndProve(pair()), "");
}

// Fused steps: rrs (recv, reduce, send on without storing) and rcs (recv,
// store, forward) on a 3-GPU chain 0 -> 1 -> 2 reduced at 2 and sent back
// 2 -> 1 -> 0 ... as a ring: GPU 0 sends, GPU 1 rrs, GPU 2 rrcs, then the
// sum travels on with rcs at 0 and r at 1.
TEST(MscclXml, FusedStepsAreLoweredAndProven) {
  const char* text = R"(<algo name="chain" proto="LL" nchannels="1" nchunksperloop="1" ngpus="3" coll="allreduce" inplace="1" outofplace="1">
  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="1" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="rrs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="0" recv="1" chan="0">
      <step s="0" type="rrcs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>)";
  auto spec = parseMscclXml(text, "chain.xml");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_EQ(spec->inplace, PlanInPlace::Both);
  EXPECT_EQ(spec->scratch, 1u);  // rrs's sum
  ASSERT_EQ(spec->programs[1].size(), 3u);
  EXPECT_EQ(spec->programs[1][0].op, StepOp::RecvReduce);
  EXPECT_EQ(spec->programs[1][0].dst.buf, Buf::Scratch);
  EXPECT_EQ(spec->programs[1][1].op, StepOp::Send);
  EXPECT_EQ(spec->programs[1][1].src.buf, Buf::Scratch);
  EXPECT_EQ(importAndProve(text, "chain.xml"), "");
  // Without the final receive at GPU 1, its output never gets the sum (and
  // GPU 0's forward is never received).
  const std::string cut = replaced(text, R"(<step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>)", "");
  EXPECT_NE(importAndProve(cut, "chain.xml").find("chain.xml: gpu 0 tb 0 step 1 (line 5, rcs) sends to gpu 1 on "
                                                  "channel 0, and gpu 1 never receives it"), std::string::npos)
      << importAndProve(cut, "chain.xml");
}

TEST(MscclXml, WrongResultIsRefusedWithTheVerifiersCounterExample) {
  // GPU 0 never adds what it received.
  const std::string msg = importAndProve(pair(R"(<step s="1" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="0" deps="1" hasdep="0"/>)"));
  EXPECT_NE(msg.find("pair.xml: plan 'pair' fails its proof (count 1, out of place)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0: output element 0 holds ranks {0} element 0 but should hold ranks {0,1} element 0"),
            std::string::npos) << msg;
}

TEST(MscclXml, RaceBetweenThreadBlocksIsRefused) {
  // The add no longer waits for the receive into the scratch it reads.
  const std::string msg = importAndProve(pair(replaced(kRe, R"(depid="0" deps="1")", R"(depid="-1" deps="-1")")));
  EXPECT_NE(msg.find("pair.xml: race on gpu 0's chunk s[0]: gpu 0 tb 1 step 1 (line 9, re) and gpu 0 tb 0 step 1 "
                     "(line 5, r) read and write it, and neither waits for the other"), std::string::npos) << msg;
}

TEST(MscclXml, DeadlockNamesTheStepThatNeverRuns) {
  // Both GPUs receive before they send, on one thread block each.
  std::string text = pair();
  for (int k = 0; k < 2; ++k) {
    text = replaced(text, R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>)",
                    R"(<step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="1" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>)");
  }
  text = replaced(text, R"(depid="0" deps="1")", R"(depid="0" deps="0")");
  text = replaced(text, R"(depid="0" deps="1")", R"(depid="0" deps="0")");
  const std::string msg = importAndProve(text);
  EXPECT_NE(msg.find("pair.xml: deadlock: gpu 0 tb 0 step 0 (line 4, r) never runs: it waits for a message from gpu 1 "
                     "on channel 0 that is never sent"), std::string::npos) << msg;
}

// GPU 0 sends X on channel 0 and then (its tb 1 waits for that) Y on channel
// 1; GPU 1 takes Y first and X only after (its tb 0 waits for tb 1).  MSCCL's
// per-channel connections allow it; chorus's one order per pair cannot.
TEST(MscclXml, MessageOrderChorusCannotKeepIsRefused) {
  const char* text = R"(<algo name="cross" proto="Simple" nchannels="2" nchunksperloop="2" ngpus="2" coll="allgather" inplace="0" outofplace="1">
  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
    </tb>
    <tb id="1" send="1" recv="-1" chan="1">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="0" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="-1" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="1" deps="0" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="0" chan="1">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
    </tb>
  </gpu>
</algo>)";
  const std::string msg = importAndProve(text, "cross.xml");
  EXPECT_NE(msg.find("cross.xml: no per-pair message order: gpu 1 tb 1 step 0 (line 15, r) never runs: the message it "
                     "waits for, from gpu 0 on channel 1, is not the oldest one gpu 0 has sent to gpu 1"),
            std::string::npos) << msg;
}

TEST(MscclXml, MalformedProgramsNameLineElementAndAttribute) {
  const std::string p = pair();
  struct Case {
    std::string text;
    const char* want;
  };
  const Case cases[] = {
      {"<algos/>", "pair.xml:1: <algos> is not MSCCL's root element <algo>"},
      {replaced(p, "coll=\"allreduce\"", "coll=\"broadcast\""),
       "pair.xml:1: <algo> attribute 'coll': 'broadcast' is rooted, and MSCCL's XML names no root"},
      {replaced(p, "coll=\"allreduce\"", "coll=\"sendrecv\""), "'sendrecv' is not a collective this reader imports"},
      {replaced(p, "ngpus=\"2\"", "ngpus=\"65\""), "pair.xml:1: <algo> attribute 'ngpus': 65 is out of range (2 to 64)"},
      {replaced(p, "ngpus=\"2\"", "ngpus=\"2x\""), "<algo> attribute 'ngpus': '2x' is not a decimal integer"},
      {replaced(p, "proto=\"Simple\"", "proto=\"Fast\""), "'Fast' is not one of MSCCL's protocols"},
      {replaced(p, " nchannels=\"1\"", ""), "pair.xml:1: <algo> lacks attribute 'nchannels'"},
      {replaced(p, "inplace=\"0\" outofplace=\"1\"", "inplace=\"0\" outofplace=\"0\""), "claims neither form"},
      {replaced(p, "maxBytes=\"0\"", "maxBytes=\"0\" colour=\"red\""),
       "<algo> attribute 'colour': not an attribute of MSCCL's <algo>"},
      {replaced(p, "<gpu id=\"1\"", "<gpu id=\"0\""), "pair.xml:12: <gpu> id=\"0\" given twice (first on line 2)"},
      {replaced(p, "<gpu id=\"1\"", "<gpu id=\"2\""), "pair.xml:12: <gpu> attribute 'id': 2 is out of range (0 to 1)"},
      {replaced(p, "<tb id=\"0\" send=\"1\"", "<tb id=\"0\" send=\"0\""),
       "pair.xml:3: <tb> send=\"0\" is its own gpu"},
      {replaced(p, "<tb id=\"1\" send=\"-1\"", "<tb id=\"0\" send=\"-1\""),
       "pair.xml:7: <tb> id=\"0\" given twice on gpu 0 (first on line 3)"},
      {replaced(p, "type=\"cpy\"", "type=\"copy\""),
       "pair.xml:8: <step> attribute 'type': 'copy' is not one of MSCCL's step types"},
      {replaced(p, "<step s=\"1\" type=\"r\"", "<step s=\"2\" type=\"r\""),
       "pair.xml:5: <step> s=\"2\" at position 1 of its thread block"},
      {replaced(p, "srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\"", "srcbuf=\"x\" srcoff=\"0\" dstbuf=\"o\""),
       "pair.xml:8: <step> attribute 'srcbuf': 'x' is not a buffer"},
      {replaced(p, "type=\"cpy\" srcbuf=\"i\" srcoff=\"0\"", "type=\"cpy\" srcbuf=\"i\" srcoff=\"1\""),
       "pair.xml:8: <step> srcbuf=\"i\" srcoff=\"1\" cnt=\"1\": past the 1 chunks gpu 0 declares"},
      {replaced(p, "depid=\"0\" deps=\"1\"", "depid=\"5\" deps=\"1\""),
       "pair.xml:9: <step> depid=\"5\": gpu 0 has no thread block of that id"},
      {replaced(p, "depid=\"0\" deps=\"1\"", "depid=\"0\" deps=\"2\""),
       "pair.xml:9: <step> deps=\"2\": thread block 0 of gpu 0 has 2 steps"},
      {replaced(p, "depid=\"0\" deps=\"1\"", "depid=\"0\" deps=\"-1\""), "both name a step or both are -1"},
      {replaced(p, "<tb id=\"0\" send=\"1\" recv=\"1\"", "<tb id=\"0\" send=\"-1\" recv=\"1\""),
       "pair.xml:4: <step> type=\"s\" sends, but its <tb> (line 3) has send=\"-1\""},
      {replaced(p, "type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"0\" cnt=\"1\"",
                "type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"0\" cnt=\"0\""),
       "pair.xml:4: <step> attribute 'cnt': 0 is out of range"},
      {replaced(p, "<tb id=\"1\" send=\"-1\" recv=\"-1\" chan=\"0\">", "<tb id=\"1\" send=\"-1\" recv=\"-1\" chan=\"0\"><x/>"),
       "pair.xml:7: <x> inside <tb>: only <step> elements belong there"},
      {replaced(p, "</algo>", "<gpu/></algo>"), "pair.xml:22: <gpu> lacks attribute 'id'"},
      {replaced(replaced(p, "<gpu id=\"1\"", "<gpx id=\"1\""), "</gpu>\n</algo>", "</gpx>\n</algo>"),
       "pair.xml:12: <gpx> inside <algo>: only <gpu> elements belong there"},
      {p.substr(0, p.find("<gpu id=\"1\"")) + "</algo>", "pair.xml:1: <algo> has no <gpu id=\"1\">"},
      {p.substr(0, p.find("<gpu id=\"1\"")), "pair.xml:1: <algo> is never closed"},
      // GPU 0 receives two chunks where GPU 1 sends one.
      {replaced(replaced(p, "s_chunks=\"1\"", "s_chunks=\"2\""),
                "type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"0\" cnt=\"1\"",
                "type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"0\" cnt=\"2\""),
       "pair.xml:5: <step> type=\"r\" receives cnt=\"2\" chunks, but the message it pairs with, gpu 1 tb 0 step 0 "
       "(line 14, s), has cnt=\"1\""},
      // The input is read-only out of place.
      {replaced(p, "type=\"cpy\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\"", "type=\"cpy\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\""),
       "pair.xml:8: <step> type=\"cpy\" on gpu 0, as chorus's copy: the destination is 'in': the call's input is "
       "read-only"},
  };
  for (const Case& c : cases) {
    auto spec = parseMscclXml(c.text, "pair.xml");
    ASSERT_FALSE(spec.isOk()) << c.want;
    EXPECT_NE(spec.status().message().find(c.want), std::string::npos)
        << "want: " << c.want << "\ngot:  " << spec.status().message();
  }
}

TEST(MscclXml, ReaderTableHasTheMscclFormat) {
  bool found = false;
  for (const PlanReader& r : planReaders())
    if (r.name == "msccl" && r.extension == ".xml") found = true;
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace plan
}  // namespace chorus
