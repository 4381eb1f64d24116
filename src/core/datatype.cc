#include "core/datatype.h"

namespace fusco {

size_t dataTypeSize(const fuscoDataType_t& type) {
  switch (rawEnum(type)) {
    case fuscoInt8:
    case fuscoUint8:
    case fuscoFloat8e4m3:
    case fuscoFloat8e5m2:
      return 1;
    case fuscoFloat16:
    case fuscoBfloat16:
      return 2;
    case fuscoInt32:
    case fuscoUint32:
    case fuscoFloat32:
      return 4;
    case fuscoInt64:
    case fuscoUint64:
    case fuscoFloat64:
      return 8;
    default:
      return 0;
  }
}

}  // namespace fusco
