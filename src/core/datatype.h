// Datatypes as the C API passes them: an int that may hold any value, read without assuming it
// is one of the enum's members.
#pragma once

#include <cstddef>
#include <cstring>

#include "fusco.h"

namespace fusco {

// The integer a C caller passed for an enum parameter. C allows any int there; reading it as the
// C++ enum type could be undefined when it is out of range, so every check goes through this.
inline int rawEnum(const fuscoDataType_t& t) {
  int v;
  static_assert(sizeof(v) == sizeof(t), "fuscoDataType_t is int-sized");
  memcpy(&v, &t, sizeof(v));
  return v;
}

// Element size of a datatype, or 0 if it is not one.
size_t dataTypeSize(const fuscoDataType_t& t);

}  // namespace fusco
