//! Integration tests: every test starts a real `idemd` process on
//! 127.0.0.1:0 and talks to it over real sockets.

#![allow(clippy::unwrap_used, unreachable_pub)]

mod support;

mod t01_connection;
mod t02_records;
mod t03_bad_input;
mod t04_waiting;
mod t05_races;
mod t06_load;
mod t07_redis_tools;
mod t08_config;
mod t09_client;
mod t10_durability;
mod t11_hardening;
mod t12_client_safety;
mod t13_cluster;
mod t14_sim;
mod t15_http;
mod t16_auth;
mod t17_acl;
mod t18_tls;
