# The CPU instruction sets, read from their registry src/cpu/isa.h (KD_ISAS: one row
# X(ID, name, layer, has, "flags") an ISA), so an ISA is named in one place for C and CMake.
# Each ISA compiles the generic sources once, SLEEF's way: src/cpu/*_isa.c for every ISA, and
# src/cpu/*_vec.c for those with a vector layer, as the object library kd_isa_<name> with the
# row's flags and KD_ISA_NAME=<name>, KD_LAYER_<layer>=1 defined (isa.h's KD_SFX suffixes the
# symbols). tests/test_*_vec.c become one program per vector ISA, test_*_<name>.
# docs/ARCHITECTURE.md, "Instruction sets".

set(KD_ISA_REGISTRY ${CMAKE_CURRENT_SOURCE_DIR}/src/cpu/isa.h)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${KD_ISA_REGISTRY})
set(KD_ISA_ROW "X\\(([A-Z0-9_]+), *([a-z0-9_]+), *([A-Z0-9_]+), *([A-Za-z0-9_]+), *\"([^\"]*)\"\\)")
file(STRINGS ${KD_ISA_REGISTRY} kd_isa_rows REGEX "^ *X\\(")
# the rows end in the macro's line continuations: a backslash would escape the list's ";"
string(REPLACE "\\" "" kd_isa_rows "${kd_isa_rows}")
set(KD_ISAS "")
foreach(row ${kd_isa_rows})
  string(REGEX MATCHALL "X\\(" xs "${row}")
  list(LENGTH xs nx)
  if(NOT nx EQUAL 1 OR NOT row MATCHES "^ *${KD_ISA_ROW} *$")
    message(FATAL_ERROR "src/cpu/isa.h: a KD_ISAS row CMake cannot read: ${row}")
  endif()
  set(name ${CMAKE_MATCH_2})
  list(APPEND KD_ISAS ${name})
  set(KD_ISA_${name}_LAYER ${CMAKE_MATCH_3})
  separate_arguments(KD_ISA_${name}_FLAGS UNIX_COMMAND "${CMAKE_MATCH_5}")
endforeach()
if(NOT KD_ISAS)
  message(FATAL_ERROR "src/cpu/isa.h: no KD_ISAS rows found")
endif()

file(GLOB KD_ISA_SRC CONFIGURE_DEPENDS src/cpu/*_isa.c)
file(GLOB KD_VEC_SRC CONFIGURE_DEPENDS src/cpu/*_vec.c)

# Compiles target's sources for ISA name: its flags and the definitions of isa.h.
function(kd_isa_target target name)
  target_compile_options(${target} PRIVATE ${KD_ISA_${name}_FLAGS})
  target_compile_definitions(${target} PRIVATE KD_ISA_NAME=${name}
                             KD_LAYER_${KD_ISA_${name}_LAYER}=1)
endfunction()

# KD_ISA_OBJECTS: the objects of every ISA's copy of the generic sources (kd_isa_<name>), for
# the libraries beside kd_core's. KD_ISA_TARGETS: those object libraries.
set(KD_ISA_OBJECTS "")
set(KD_ISA_TARGETS "")
foreach(name ${KD_ISAS})
  set(srcs ${KD_ISA_SRC})
  if(NOT KD_ISA_${name}_LAYER STREQUAL "SCALAR")
    list(APPEND srcs ${KD_VEC_SRC})
  endif()
  add_library(kd_isa_${name} OBJECT ${srcs})
  target_include_directories(kd_isa_${name} PRIVATE include src src/common)
  target_link_libraries(kd_isa_${name} PRIVATE OpenMP::OpenMP_C)
  target_compile_options(kd_isa_${name} PRIVATE -fvisibility=hidden)
  kd_isa_target(kd_isa_${name} ${name})
  list(APPEND KD_ISA_OBJECTS $<TARGET_OBJECTS:kd_isa_${name}>)
  list(APPEND KD_ISA_TARGETS kd_isa_${name})
endforeach()
