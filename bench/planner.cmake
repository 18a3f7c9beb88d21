# bench_planner: cold planning time (PlanRedistribute, no cache) against mesh dims (1-5) and size (up
# to 10^4 ranks), beside greedy-only planning.
add_executable(bench_planner ${CMAKE_CURRENT_LIST_DIR}/planner.cc)
target_link_libraries(bench_planner PRIVATE dt_dtensor)
