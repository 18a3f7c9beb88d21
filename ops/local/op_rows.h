#pragma once
// The grammar of the op lists (DT_OPS and DT_DECLARED_OPS in ops/local/ops.h, DT_LAYOUT_OPS in
// ops/dtensor_ops.h): one row per public op, from which its overloads on Tensors, DTensors and
// Values and its call builder are made.
//
// A row's parameters are the op's parameter list in order, in parentheses, each one of
//
//   DT_IN(name)                     a tensor: a Tensor, DTensor or Value, by overload
//   DT_OPT(name)                    an optional tensor; its default is none (Tensor(), ...)
//   DT_ATTR(type, name[, default])  any other parameter: an attribute of the op's call
//
// so that (DT_IN(x), DT_OPT(weight), DT_ATTR(double, eps, 1e-6)) is, on DTensors,
// (const DTensor& x, const DTensor& weight = DTensor(), double eps = 1e-6). A type or default
// may not hold a comma outside parentheses.
//
// A file that makes something of the rows says what each kind of parameter becomes: three macros
// <prefix>In(name), <prefix>Opt(name) and <prefix>Attr(type, name, ...) that expand to ", <what>"
// (or to nothing), joined by DT_ROW_LIST(prefix, params) into a list without the first comma:
//
//   #define DT_TENSOR_PARAM_In(n) , const Tensor& n
//   #define DT_TENSOR_PARAM_Opt(n) , const Tensor& n = Tensor()
//   #define DT_TENSOR_PARAM_Attr(t, n, ...) , t n __VA_OPT__(= __VA_ARGS__)
//   absl::StatusOr<Tensor> Linear(DT_ROW_LIST(DT_TENSOR_PARAM_, params));
//
// DT_ROW_EACH(prefix, params) is the same without dropping anything (struct fields, sums).

#define DT_IN(name) (In, name)
#define DT_OPT(name) (Opt, name)
#define DT_ATTR(type, ...) (Attr, type, __VA_ARGS__)

#define DT_ROW_LIST(prefix, params) DT_ROW_REST_(_ DT_ROW_EACH(prefix, params))
#define DT_ROW_EACH(prefix, params) DT_ROW_EACH_I_(prefix, DT_ROW_UNPAREN_ params)

// The result of a row of DT_OPS on T: T, or std::vector<T> for the rows marked List, or
// TopKOf<T> for those marked TopK (the optional fourth field).
#define DT_ROW_RESULT(T, ...) DT_ROW_RESULT_##__VA_ARGS__(T)
#define DT_ROW_RESULT_(T) T
#define DT_ROW_RESULT_List(T) std::vector<T>
#define DT_ROW_RESULT_TopK(T) TopKOf<T>

// DT_ROW_CALL_EACH(X, , (a...), (b...)): X(a...) X(b...); the first argument after X is dropped,
// so that a list can be made into another's rows by a macro that expands each row to ", (...)".
#define DT_ROW_CALL_EACH(X, ...) DT_ROW_CALL_I_(X, DT_ROW_REST_(__VA_ARGS__))

// ---- machinery (at most 8 parameters per row, 16 rows per DT_ROW_CALL_EACH) ----------------------

#define DT_ROW_UNPAREN_(...) __VA_ARGS__
#define DT_ROW_REST_(...) DT_ROW_REST_I_(__VA_ARGS__)
#define DT_ROW_REST_I_(first, ...) __VA_ARGS__
#define DT_ROW_CAT_(a, b) DT_ROW_CAT_I_(a, b)
#define DT_ROW_CAT_I_(a, b) a##b
#define DT_ROW_COUNT_(...) DT_ROW_COUNT_I_(__VA_ARGS__ __VA_OPT__(, ) 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define DT_ROW_COUNT_I_(a1, a2, a3, a4, a5, a6, a7, a8, n, ...) n

#define DT_ROW_EACH_I_(p, ...) DT_ROW_CAT_(DT_ROW_EACH_, DT_ROW_COUNT_(__VA_ARGS__))(p, __VA_ARGS__)
#define DT_ROW_APPLY_(p, e) DT_ROW_APPLY_I_(p, DT_ROW_UNPAREN_ e)
#define DT_ROW_APPLY_I_(p, ...) DT_ROW_APPLY_II_(p, __VA_ARGS__)
#define DT_ROW_APPLY_II_(p, kind, ...) p##kind(__VA_ARGS__)
#define DT_ROW_EACH_0(p, ...)
#define DT_ROW_EACH_1(p, e) DT_ROW_APPLY_(p, e)
#define DT_ROW_EACH_2(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_1(p, __VA_ARGS__)
#define DT_ROW_EACH_3(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_2(p, __VA_ARGS__)
#define DT_ROW_EACH_4(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_3(p, __VA_ARGS__)
#define DT_ROW_EACH_5(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_4(p, __VA_ARGS__)
#define DT_ROW_EACH_6(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_5(p, __VA_ARGS__)
#define DT_ROW_EACH_7(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_6(p, __VA_ARGS__)
#define DT_ROW_EACH_8(p, e, ...) DT_ROW_APPLY_(p, e) DT_ROW_EACH_7(p, __VA_ARGS__)

#define DT_ROW_CALL_I_(X, ...) DT_ROW_CAT_(DT_ROW_CALL_, DT_ROW_COUNT16_(__VA_ARGS__))(X, __VA_ARGS__)
#define DT_ROW_COUNT16_(...) \
  DT_ROW_COUNT16_I_(__VA_ARGS__ __VA_OPT__(, ) 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define DT_ROW_COUNT16_I_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, n, \
                          ...)                                                                 \
  n
#define DT_ROW_CALL_0(X, ...)
#define DT_ROW_CALL_1(X, r) X r
#define DT_ROW_CALL_2(X, r, ...) X r DT_ROW_CALL_1(X, __VA_ARGS__)
#define DT_ROW_CALL_3(X, r, ...) X r DT_ROW_CALL_2(X, __VA_ARGS__)
#define DT_ROW_CALL_4(X, r, ...) X r DT_ROW_CALL_3(X, __VA_ARGS__)
#define DT_ROW_CALL_5(X, r, ...) X r DT_ROW_CALL_4(X, __VA_ARGS__)
#define DT_ROW_CALL_6(X, r, ...) X r DT_ROW_CALL_5(X, __VA_ARGS__)
#define DT_ROW_CALL_7(X, r, ...) X r DT_ROW_CALL_6(X, __VA_ARGS__)
#define DT_ROW_CALL_8(X, r, ...) X r DT_ROW_CALL_7(X, __VA_ARGS__)
#define DT_ROW_CALL_9(X, r, ...) X r DT_ROW_CALL_8(X, __VA_ARGS__)
#define DT_ROW_CALL_10(X, r, ...) X r DT_ROW_CALL_9(X, __VA_ARGS__)
#define DT_ROW_CALL_11(X, r, ...) X r DT_ROW_CALL_10(X, __VA_ARGS__)
#define DT_ROW_CALL_12(X, r, ...) X r DT_ROW_CALL_11(X, __VA_ARGS__)
#define DT_ROW_CALL_13(X, r, ...) X r DT_ROW_CALL_12(X, __VA_ARGS__)
#define DT_ROW_CALL_14(X, r, ...) X r DT_ROW_CALL_13(X, __VA_ARGS__)
#define DT_ROW_CALL_15(X, r, ...) X r DT_ROW_CALL_14(X, __VA_ARGS__)
#define DT_ROW_CALL_16(X, r, ...) X r DT_ROW_CALL_15(X, __VA_ARGS__)
