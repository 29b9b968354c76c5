// libchorus.so is the chorus_core archive linked whole; this translation unit
// only gives the shared library a source of its own.  The exported symbols are
// the chorus* C functions (see chorus.map).
