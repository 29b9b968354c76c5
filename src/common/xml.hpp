// A small, bounds-checked reader for the subset of XML that other projects'
// data files use: MSCCL's algorithm programs (plan/msccl_file.cpp) and
// NCCL's topology dumps (sim/nccl_topo.cpp).  It reads elements, attributes
// (single or double quoted, with the five predefined entities and decimal or
// hexadecimal character references of ASCII), comments, an XML declaration
// at the start and white space between elements.  Everything else -- text
// content, CDATA, DOCTYPE, processing instructions, other entities -- is
// refused with the line it starts on: the files it serves have none, and a
// reader that skipped them could misread a file that relies on them.
//
// The input is untrusted: every error names the origin and the line
// ("topo.xml:12: <gpu>: attribute 'dev' given twice"), nothing reads past the
// text, and the depth, the element count, the attributes per element and the
// lengths of names and values are bounded (XmlLimits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"

namespace chorus {

struct XmlAttribute {
  std::string name, value;  // value with its references replaced
  uint32_t line = 0;
};

struct XmlElement {
  std::string name;
  uint32_t line = 0;  // of its '<'
  std::vector<XmlAttribute> attributes;  // in document order, names distinct
  std::vector<XmlElement> children;
  [[nodiscard]] const XmlAttribute* find(std::string_view attr) const {
    for (const XmlAttribute& a : attributes)
      if (a.name == attr) return &a;
    return nullptr;
  }
};

struct XmlLimits {
  size_t max_bytes = size_t{64} << 20;
  int max_depth = 16;               // nested elements, the root at depth 1
  size_t max_elements = size_t{1} << 21;
  size_t max_attributes = 64;       // per element
  size_t max_name = 128;            // bytes of an element or attribute name
  size_t max_value = 4096;          // bytes of an attribute value
};

// The document's root element, or an error naming `origin` and the line.
Result<XmlElement> parseXml(std::string_view text, std::string_view origin, const XmlLimits& limits = {});

// A string from an untrusted file as a message shows it: at most 40 bytes,
// every byte that is not printable ASCII (and ' and \) as \xNN.
std::string xmlShown(std::string_view s);

}  // namespace chorus
