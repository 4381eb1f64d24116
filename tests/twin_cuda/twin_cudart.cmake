# The twin CUDA runtime's library (README.md beside this file): the CUDA runtime's C ABI on CPU
# threads, compiled by the host compiler against the toolkit's own headers (no CUDA language). A
# shared library, so that a program and the libfusco it loads share one instance (one context, as
# with the CUDA runtime). Included by the top-level CMakeLists.txt in a twin build
# (FUSCO_TWIN_CUDA) and by this folder's CMakeLists.txt for its own tests.
if(NOT TARGET fusco_twin_cudart)
  file(GLOB FUSCO_TWIN_CUDART_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/twin_*.cc)
  add_library(fusco_twin_cudart SHARED ${FUSCO_TWIN_CUDART_SOURCES})
  target_include_directories(fusco_twin_cudart PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}>
                             ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(fusco_twin_cudart PUBLIC Threads::Threads)
  # Every symbol is the library's interface (the CUDA runtime's C ABI and twincuda::).
  set_target_properties(fusco_twin_cudart PROPERTIES CXX_VISIBILITY_PRESET default
                                                     VISIBILITY_INLINES_HIDDEN OFF)
endif()
