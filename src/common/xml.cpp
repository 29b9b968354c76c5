// The XML subset reader (xml.hpp).  A cursor over the text that counts lines;
// every read checks the end first.  Elements nest by recursion bounded by
// XmlLimits::max_depth.
#include "common/xml.hpp"

#include <algorithm>

#include "common/shown.hpp"

namespace chorus {
namespace {

bool nameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool nameChar(char c) { return nameStart(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class Reader {
 public:
  Reader(std::string_view text, std::string_view origin, const XmlLimits& lim)
      : t_(text), origin_(origin), lim_(lim) {}

  Result<XmlElement> run() {
    if (t_.size() > lim_.max_bytes)
      return invalidArgument("{}: {} bytes: at most {} are read", origin_, t_.size(), lim_.max_bytes);
    if (t_.substr(0, 3) == "\xEF\xBB\xBF") p_ = 3;  // a UTF-8 byte order mark
    if (t_.substr(p_, 5) == "<?xml" && p_ + 5 < t_.size() && space(t_[p_ + 5])) {
      const size_t end = t_.find("?>", p_);
      if (end == std::string_view::npos) return fail(line_, "the XML declaration has no '?>'");
      advanceTo(end + 2);
    }
    CHORUS_RETURN_IF_ERROR(misc(true));
    if (p_ >= t_.size()) return fail(line_, "no element (an empty or truncated file)");
    XmlElement root;
    CHORUS_RETURN_IF_ERROR(element(root, 1));
    CHORUS_RETURN_IF_ERROR(misc(false));
    if (p_ < t_.size()) return fail(line_, fmt::format("'{}' after the root element <{}> closed (one root element)",
                                                       xmlShown(t_.substr(p_, 20)), xmlShown(root.name)));
    return root;
  }

 private:
  Status fail(uint32_t line, std::string what) const { return invalidArgument("{}:{}: {}", origin_, line, what); }

  void advanceTo(size_t q) {
    for (; p_ < q && p_ < t_.size(); ++p_)
      if (t_[p_] == '\n') ++line_;
  }
  void skipSpace() {
    while (p_ < t_.size() && space(t_[p_])) advanceTo(p_ + 1);
  }
  bool at(std::string_view s) const { return t_.substr(p_, s.size()) == s; }

  // White space, comments, and what is refused where markup may stand
  // outside an element's tag: stops at '<' of an element or end tag, at text,
  // or at the end.
  Status misc(bool prolog) {
    for (;;) {
      skipSpace();
      if (p_ >= t_.size()) return {};
      if (at("<!--")) {
        const uint32_t start = line_;
        const size_t end = t_.find("-->", p_ + 4);
        if (end == std::string_view::npos) return fail(start, "a comment '<!--' that never ends ('-->')");
        advanceTo(end + 3);
        continue;
      }
      if (at("<?"))
        return fail(line_, prolog && at("<?xml") ? "the XML declaration is not at the start of the file"
                                                : "a processing instruction '<?...?>' (not read by this reader)");
      if (at("<![CDATA[")) return fail(line_, "a CDATA section (not read by this reader)");
      if (at("<!")) return fail(line_, "a DOCTYPE or other '<!' declaration (not read by this reader)");
      return {};
    }
  }

  Result<std::string> name(std::string_view what) {
    const size_t b = p_;
    if (p_ >= t_.size() || !nameStart(t_[p_]))
      return fail(line_, fmt::format("{}: '{}' is not a name", what, xmlShown(t_.substr(p_, 20))));
    while (p_ < t_.size() && nameChar(t_[p_])) ++p_;
    if (p_ - b > lim_.max_name) return fail(line_, fmt::format("{}: a name longer than {} bytes", what, lim_.max_name));
    return std::string(t_.substr(b, p_ - b));
  }

  // An attribute value after its opening quote, to the closing one.
  Result<std::string> value(const std::string& elem, const std::string& attr, char quote) {
    std::string v;
    const uint32_t start = line_;
    const auto where = [&] { return fmt::format("<{}> attribute '{}'", elem, xmlShown(attr)); };
    for (;;) {
      if (p_ >= t_.size()) return fail(start, fmt::format("{}: the value never ends (no closing {})", where(), quote));
      const char c = t_[p_];
      if (c == quote) {
        ++p_;
        return v;
      }
      if (c == '<') return fail(line_, fmt::format("{}: '<' in a value (write &lt;)", where()));
      if (c == '&') {
        const size_t semi = t_.find(';', p_);
        if (semi == std::string_view::npos || semi - p_ > 10)
          return fail(line_, fmt::format("{}: '&' that starts no reference (write &amp;)", where()));
        const std::string_view ref = t_.substr(p_ + 1, semi - p_ - 1);
        char out = 0;
        if (ref == "lt") out = '<';
        else if (ref == "gt") out = '>';
        else if (ref == "amp") out = '&';
        else if (ref == "quot") out = '"';
        else if (ref == "apos") out = '\'';
        else if (ref.size() >= 2 && ref[0] == '#') {
          const bool hex = ref[1] == 'x';
          const std::string_view digits = ref.substr(hex ? 2 : 1);
          uint32_t code = 0;
          bool ok = !digits.empty();
          for (char d : digits) {
            int x = d >= '0' && d <= '9' ? d - '0' : hex && d >= 'a' && d <= 'f' ? d - 'a' + 10
                                                   : hex && d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
            if (x < 0 || code > 0x10000) ok = false;
            if (x >= 0) code = code * (hex ? 16 : 10) + static_cast<uint32_t>(x);
          }
          if (!ok || code == 0 || code > 0x7f)
            return fail(line_, fmt::format("{}: character reference '&{};' is not one of ASCII (read: 1 to 127)",
                                           where(), xmlShown(ref)));
          out = static_cast<char>(code);
        } else {
          return fail(line_, fmt::format("{}: entity '&{};' is not one of &lt; &gt; &amp; &quot; &apos;", where(),
                                         xmlShown(ref)));
        }
        v += out;
        advanceTo(semi + 1);
      } else {
        v += c;
        advanceTo(p_ + 1);
      }
      if (v.size() > lim_.max_value)
        return fail(start, fmt::format("{}: a value longer than {} bytes", where(), lim_.max_value));
    }
  }

  Status element(XmlElement& e, int depth) {
    if (depth > lim_.max_depth)
      return fail(line_, fmt::format("elements nest deeper than {} levels", lim_.max_depth));
    if (++elements_ > lim_.max_elements)
      return fail(line_, fmt::format("more than {} elements", lim_.max_elements));
    e.line = line_;
    ++p_;  // '<'
    CHORUS_ASSIGN_OR_RETURN(e.name, name("an element"));
    // Attributes, then '/>' or '>'.
    for (;;) {
      const size_t before = p_;
      skipSpace();
      if (p_ >= t_.size()) return fail(e.line, fmt::format("<{}>: the tag never ends (no '>')", e.name));
      if (at("/>")) {
        p_ += 2;
        return {};
      }
      if (t_[p_] == '>') {
        ++p_;
        break;
      }
      if (p_ == before)
        return fail(line_, fmt::format("<{}>: '{}' where white space, an attribute, '>' or '/>' belongs", e.name,
                                       xmlShown(t_.substr(p_, 1))));
      XmlAttribute a;
      a.line = line_;
      CHORUS_ASSIGN_OR_RETURN(a.name, name(fmt::format("<{}>'s attribute", e.name)));
      if (e.find(a.name) != nullptr)
        return fail(a.line, fmt::format("<{}>: attribute '{}' given twice", e.name, a.name));
      if (e.attributes.size() == lim_.max_attributes)
        return fail(a.line, fmt::format("<{}>: more than {} attributes", e.name, lim_.max_attributes));
      skipSpace();
      if (p_ >= t_.size() || t_[p_] != '=')
        return fail(line_, fmt::format("<{}> attribute '{}': no '=' after the name", e.name, a.name));
      ++p_;
      skipSpace();
      if (p_ >= t_.size() || (t_[p_] != '"' && t_[p_] != '\''))
        return fail(line_, fmt::format("<{}> attribute '{}': the value is not quoted", e.name, a.name));
      const char quote = t_[p_++];
      CHORUS_ASSIGN_OR_RETURN(a.value, value(e.name, a.name, quote));
      e.attributes.push_back(std::move(a));
    }
    // Content: children, comments and white space, to the end tag.
    for (;;) {
      CHORUS_RETURN_IF_ERROR(misc(false));
      if (p_ >= t_.size())
        return fail(e.line, fmt::format("<{}> is never closed (no '</{}>'; a truncated file?)", e.name, e.name));
      if (t_[p_] != '<')
        return fail(line_, fmt::format("<{}>: text '{}' inside an element (this reader reads elements and "
                                       "attributes only)", e.name, xmlShown(t_.substr(p_, 20))));
      if (at("</")) {
        const uint32_t line = line_;
        p_ += 2;
        CHORUS_ASSIGN_OR_RETURN(const std::string closing, name("an end tag"));
        if (closing != e.name)
          return fail(line, fmt::format("</{}> closes <{}> (opened on line {})", closing, e.name, e.line));
        skipSpace();
        if (p_ >= t_.size() || t_[p_] != '>') return fail(line_, fmt::format("</{}>: no '>'", closing));
        ++p_;
        return {};
      }
      e.children.emplace_back();
      CHORUS_RETURN_IF_ERROR(element(e.children.back(), depth + 1));
    }
  }

  std::string_view t_;
  std::string_view origin_;
  const XmlLimits& lim_;
  size_t p_ = 0;
  uint32_t line_ = 1;
  size_t elements_ = 0;
};

}  // namespace

Result<XmlElement> parseXml(std::string_view text, std::string_view origin, const XmlLimits& limits) {
  return Reader(text, origin, limits).run();
}

std::string xmlShown(std::string_view t) { return shownUntrusted(t); }

}  // namespace chorus
